from django.urls import path

from accounts.apis import ApiKeyListApi

urlpatterns = [
    path("v1/api-keys", ApiKeyListApi.as_view(), name="api-keys"),
]
