"""Tenants: who a request acts for (a principal), what it may see, and its quota.

See docs/tenants.md. ``principal`` holds the request's principal; ``keys`` hashes API keys;
``directory`` reads the tenants file; ``authn`` turns a request into a principal;
``quotas`` checks a tenant's budget on create.
"""
