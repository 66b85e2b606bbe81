"""The service's own small domain, a Django app labelled "exchange": business status and the general
endpoints (ping, time, check-sys-status, user/ip, the OpenAPI document)."""
