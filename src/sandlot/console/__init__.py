"""The web console at ``/console``: a static single-page app plus browser sessions.

The page talks to the ordinary ``/v1`` API (and to execd through the server proxy); a signed-in
browser is authenticated there by a server-side session (``sessions``), which the API-key
middleware (``server.auth``) turns into the key the user signed in with.
"""
