"""A minimal Django project for `tests/test_django.py`: settings, views and URLs that use
`sluice.django` as an application would."""
