"""``heapscope serve``: one interactive viewer in the browser for sessions, dumps and leaks.

The viewer is a small web application (:mod:`heapscope.serve.app`) over the same library
functions as the commands (:mod:`heapscope.serve.views`), showing inputs by number
(:mod:`heapscope.serve.catalog`), run by :mod:`heapscope.serve.server`. The page itself is
plain HTML, CSS and JavaScript shipped in ``serve/assets`` (the flame graph is the one of
``heapscope flamegraph``, ``web/assets/flamegraph.js``); nothing is fetched from elsewhere.

Why Starlette and uvicorn: Starlette is a small framework (routing, requests, responses,
middleware, and little else) with type hints throughout, built on ASGI, and ships a
``TestClient`` that drives the application in-process, so every endpoint is tested without a
socket; uvicorn is the standard ASGI server, the one Starlette documents, and takes a socket
bound beforehand (the URL printed is the port that answers). Neither is imported by any
other command: ``heapscope top`` starts as fast as before.
"""
