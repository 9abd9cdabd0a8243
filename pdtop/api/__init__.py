"""The OpenAI-compatible HTTP API and Prometheus `/metrics`, beside the telemetry server.

FastAPI + uvicorn + prometheus_client, the stack of vLLM's and SGLang's servers. API requests
go through the engine's own scheduler (`Engine.enqueue`, `Engine.abort`), so they run under
the current policy and split and show in telemetry like any other (`source: "api"`). This
package imports the engine, never telemetry or the UI; the engine imports nothing of it.

- `server.py`: `ApiServer`, uvicorn on a socket inside the caller's event loop;
- `app.py`: the routes (`/v1/chat/completions`, `/v1/completions`, `/v1/models`, `/health`, `/metrics`);
- `answers.py`: a request's answer, whole or streamed, one choice per prompt;
- `prompts.py`: a prompt as token ids, refused by its size before it is tokenized;
- `connections.py`, `origins.py`: what hostile clients meet (header and body deadlines, header and
  trailer sizes, the token before the body, connection caps, TCP_NODELAY; Origin and Host checks);
- `schemas.py`: the request bodies, checked (what is refused, and why, names the field);
- `body_shape.py`: a body's values counted before it is parsed;
- `streams.py`: one request in flight: tokens -> text (stop strings) on the engine thread, chunks to the loop;
- `metrics.py`: the Prometheus metrics, fed by an engine sink;
- `errors.py`: OpenAI's error shape.
"""
