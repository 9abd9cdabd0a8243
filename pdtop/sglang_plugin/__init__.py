"""pdtop inside SGLang's scheduler process: the `sglang.srt.plugins` entry point `pdtop` (docs/sglang.md).

`entry.register` is what SGLang's `load_plugins()` calls; it registers nothing unless
`PDTOP_SGLANG_PORT` is set. `hooks` hooks SGLang's scheduler through its own `HookRegistry`;
`tap` turns what the hooks see into pdtop's records and serves them with pdtop's telemetry server
(`server_thread`); `knobs` says which control commands a running SGLang can take, and `broadcast`
carries them to every rank through SGLang's own `/set_internal_state`.
"""
