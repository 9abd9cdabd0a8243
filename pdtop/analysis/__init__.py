"""What-if pricing, pure: the roofline comparison of the approaches (`pdtop estimate`) and the serving
metrics' math the benchmarks share. Nothing here runs an engine, a server or a request."""
