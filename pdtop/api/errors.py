"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`."""
from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse


class APIError(Exception):
    """An HTTP error answered in OpenAI's shape; `param` names the request field at fault."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error", headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(param: str | None, message: str) -> APIError:
    """400 naming the field: the message starts with it."""
    return APIError(400, f"{param}: {message}" if param else message, param=param, code="invalid_value")
