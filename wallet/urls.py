from django.urls import path

from wallet import apis

urlpatterns = [
    path("wallet/v1/config/getall", apis.CoinListApi.as_view(), name="wallet-coins"),
    path("wallet/v1/deposit/address", apis.DepositAddressApi.as_view(), name="wallet-deposit-address"),
    path("wallet/v1/withdraw/apply", apis.WithdrawApplyApi.as_view(), name="wallet-withdraw-apply"),
    path("wallet/v1/deposit/history", apis.DepositHistoryApi.as_view(), name="wallet-deposit-history"),
    path("wallet/v1/withdraw/history", apis.WithdrawHistoryApi.as_view(), name="wallet-withdraw-history"),
    path("wallet/v1/withdraw/address-whitelist", apis.WhitelistApi.as_view(), name="wallet-whitelist"),
]
