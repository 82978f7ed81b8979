"""Views limited the way an application would limit them. Policies are named here and
defined by each test's ``SLUICE`` setting, so one view runs against memory or Redis."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.utils.decorators import method_decorator
from django.views import View

from sluice import Decision
from sluice.django import ratelimit


@ratelimit("hourly", key={"ip": "ip"})
def hourly(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("hourly", key={"ip": "ip"}, method="POST")
def posts_only(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("hourly", key={"ip": "ip"}, block=False)
def soft(request: HttpRequest) -> JsonResponse:
    decision = request.sluice_decision
    return JsonResponse({"limited": request.limited, "remaining": decision.remaining})


@ratelimit("login", key={"ip": "ip", "user": "post:username"}, method="POST", count="failures")
def login(request: HttpRequest) -> HttpResponse:
    if request.POST.get("password") == "right":
        return HttpResponse("welcome")
    return HttpResponse("wrong password", status=401)


def _form_said_wrong(request: HttpRequest, response: HttpResponse) -> bool:
    return response.get("X-Login") == "failed"


@ratelimit(
    "login", key={"ip": "ip", "user": "post:username"}, count="failures", failed=_form_said_wrong
)
def login_form(request: HttpRequest) -> HttpResponse:
    """A login page that re-renders the form with 200 on a wrong password, as many do."""
    response = HttpResponse("form")
    if request.POST.get("password") != "right":
        response["X-Login"] = "failed"
    return response


@ratelimit("shared", key={"user": "get:user"})
def shared(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@method_decorator(ratelimit("hourly", key={"ip": "ip"}), name="dispatch")
class Report(View):
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("report")


@ratelimit("hourly", key={"ip": "ip"})
async def async_hourly(request: HttpRequest) -> HttpResponse:
    return HttpResponse("async ok")


# A concurrency policy ("slots", defined by each test): one slot per address.


@ratelimit("slots", key={"ip": "ip"})
def slot(request: HttpRequest) -> HttpResponse:
    return HttpResponse("slot")


@ratelimit("slots", key={"ip": "ip"})
def stream(request: HttpRequest) -> StreamingHttpResponse:
    """Holds its slot until the client has read the last chunk."""
    return StreamingHttpResponse(iter([b"first ", b"last"]))


@ratelimit("slots", key={"ip": "ip"})
def fails(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("the view failed")


@ratelimit("slots", key={"ip": "ip"})
async def async_slot(request: HttpRequest) -> HttpResponse:
    return HttpResponse("async slot")


def unlimited(request: HttpRequest) -> HttpResponse:
    """Limited only by `RateLimitMiddleware` rules, if any match."""
    return HttpResponse("ok")


def polite_refusal(request: HttpRequest, decision: Decision) -> HttpResponse:
    """A `REFUSAL_VIEW`: a page of the application's own."""
    return HttpResponse(f"slow down ({decision.policy})", status=429, content_type="text/plain")
