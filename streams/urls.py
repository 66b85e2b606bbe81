from django.urls import path

from streams.apis import UserDataStreamApi

urlpatterns = [path("v1/userDataStream", UserDataStreamApi.as_view(), name="user-data-stream")]
