from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    # django-anymail's ESP webhooks: their tracking events feed the suppression list.
    path("anymail/", include("anymail.urls")),
    path("", include("django_prometheus.urls")),
]
