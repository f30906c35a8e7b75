"""The live page and the REST API, on FastAPI/uvicorn (imported only when ``http.enabled``).

* :mod:`app.http.settings`: the ``http:`` config section (no web imports).
* :mod:`app.http.server`: :class:`HttpServer`, uvicorn on a thread of its own.
* :mod:`app.http.api`: the FastAPI app, routes for sources, reload and pictures.
* :mod:`app.http.view`: :class:`ViewSink`, the latest annotated JPEG per watched source.
* ``static/``: the page (HTML, JS, CSS), shipped in the package.
"""
