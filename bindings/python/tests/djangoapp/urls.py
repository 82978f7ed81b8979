from django.urls import path

from . import views

urlpatterns = [
    path("hourly/", views.hourly),
    path("posts-only/", views.posts_only),
    path("soft/", views.soft),
    path("login/", views.login),
    path("login-form/", views.login_form),
    path("shared/", views.shared),
    path("report/", views.Report.as_view()),
    path("async/", views.async_hourly),
    path("slot/", views.slot),
    path("stream/", views.stream),
    path("fails/", views.fails),
    path("async-slot/", views.async_slot),
    path("api/ping/", views.unlimited),
    path("open/ping/", views.unlimited),
]
