"""HTTP hardening shared by the query service and the ingester (services may not import each other): body caps
enforced while streaming, an auth gate before the body is read, JSON nesting limits, security headers."""

from scopekb.http.jsonlimits import DepthScanner, JsonTooDeep, check_depth, loads_bounded
from scopekb.http.middleware import (
    API_CSP,
    RequestLimits,
    RequestLimitsMiddleware,
    RouteLimit,
    SecurityHeaders,
    SecurityHeadersMiddleware,
    send_error,
)

__all__ = ["API_CSP", "DepthScanner", "JsonTooDeep", "RequestLimits", "RequestLimitsMiddleware", "RouteLimit",
           "SecurityHeaders", "SecurityHeadersMiddleware", "check_depth", "loads_bounded", "send_error"]
