from django.urls import path

from convert import apis

urlpatterns = [
    # Listed with the convert routes: its symbols are the convert markets (no spot order book).
    path("v1/exchangeInfo", apis.ExchangeInfoApi.as_view(), name="exchange-info"),
    path("convert/v1/get-supported-trading-pairs", apis.SupportedPairsApi.as_view(), name="convert-pairs"),
    path("convert/v1/get-quote", apis.QuoteApi.as_view(), name="convert-quote"),
    path("convert/v1/accept-quote", apis.AcceptQuoteApi.as_view(), name="convert-accept"),
    path("convert/v1/query-order-history", apis.OrderHistoryApi.as_view(), name="convert-history"),
]
