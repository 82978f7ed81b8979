"""Settings for the Django tests, passed to `settings.configure` by `tests/test_django.py`
(no DJANGO_SETTINGS_MODULE, so other test files never see Django configured by accident).

There is no database: the views need none, and `User` instances are built unsaved."""

SECRET_KEY = "sluice-tests-only"
DEBUG = False
ALLOWED_HOSTS = ["testserver"]
ROOT_URLCONF = "djangoapp.urls"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth"]
MIDDLEWARE: list[str] = []
DATABASES: dict[str, dict[str, str]] = {}
USE_TZ = True
SLUICE: dict[str, object] = {}  # each test sets its own with override_settings
