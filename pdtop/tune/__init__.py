"""`pdtop tune`: the PD multiplexing configuration that meets the SLOs with the most goodput, searched
on pdtop's engine, on servers launched per candidate, or live from the dashboard."""
