"""`QuietLog` lives in `pdtop.quiet_log`, shared with the HTTP API (which imports no telemetry)."""
from pdtop.quiet_log import QuietLog

__all__ = ["QuietLog"]
