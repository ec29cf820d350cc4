"""Sandbox networking: namespaces' outbound path, default-deny, the egress policy and its API."""
