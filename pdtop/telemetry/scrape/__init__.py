"""Reading a serving engine's Prometheus `/metrics` page (vLLM, SGLang, pdtop): which metrics mean what
(`names`), a page to the samples pdtop reads (`page`), and the figures over a recent window (`window`,
`quantile`). `pdtop.telemetry.sources.prometheus` polls the page and turns the figures into events."""
