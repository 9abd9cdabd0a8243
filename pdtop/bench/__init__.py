"""`pdtop bench`: the policy benchmark on pdtop's engine, and a load generator for any
OpenAI-compatible server with vLLM's datasets, figures and result file (`bench --url`)."""
