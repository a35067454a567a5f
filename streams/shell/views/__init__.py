"""Web views of the streams app, one module per resource, registered in one place."""

from __future__ import annotations

from streams.handle.handlers import HandlerDeps
from streams.shell.views import health, retrieve, route, schedule, state
from streams.shell.views.bodies import Page


def pages(p: HandlerDeps) -> dict[str, Page]:
    """Every view of the app by path."""
    return {**health.pages(p), **state.pages(p), **route.pages(p), **retrieve.pages(p),
            **schedule.pages(p)}


def register_views(app, p: HandlerDeps) -> None:
    for path, page in pages(p).items():
        register(app, path, page)


def register(app, path: str, page: Page) -> None:
    """The one place a view is added to the app: a check every view needs goes here."""
    app.page(path)(page)
