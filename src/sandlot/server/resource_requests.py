"""``resourceRequests`` of a create: what the scheduler reserves for a sandbox.

Only a backend that schedules by requests (Kubernetes) can honour them; elsewhere a create
naming them is refused rather than silently run without them. Requests are for ``cpu`` and
``memory`` and may not exceed the sandbox's limits (Kubernetes itself refuses such a Pod).
"""

from __future__ import annotations

from dataclasses import dataclass

from sandlot.errors import InvalidRequest
from sandlot.server import codes
from sandlot.server.quantity import parse_cpu, parse_memory

KEYS = ("cpu", "memory")


@dataclass(frozen=True)
class Requests:
    cpu: float | None = None
    memory: int | None = None


def parse_requests(asked: dict[str, str] | None, *, supported: bool, runtime: str,
                   cpu_limit: float | None, memory_limit: int | None) -> Requests | None:
    """The create's requests, checked against its limits; None when it names none."""
    if not asked:
        return None
    if not supported:
        raise InvalidRequest(
            f"resourceRequests are not supported by the {runtime} runtime: it does not "
            "schedule by requests (only the kubernetes runtime does); give resourceLimits",
            code=codes.INVALID_PARAMETER)
    unknown = sorted(set(asked) - set(KEYS))
    if unknown:
        raise InvalidRequest(f"resourceRequests: {', '.join(unknown)} is not supported "
                             f"(give {' and '.join(KEYS)})", code=codes.INVALID_PARAMETER)
    cpu = parse_cpu(asked["cpu"]) if asked.get("cpu") else None
    memory = parse_memory(asked["memory"]) if asked.get("memory") else None
    if cpu is not None and cpu_limit is not None and cpu > cpu_limit:
        raise InvalidRequest(f"resourceRequests.cpu {asked['cpu']!r} exceeds the sandbox's "
                             f"cpu limit of {cpu_limit:g} cores", code=codes.INVALID_PARAMETER)
    if memory is not None and memory_limit is not None and memory > memory_limit:
        raise InvalidRequest(f"resourceRequests.memory {asked['memory']!r} exceeds the "
                             f"sandbox's memory limit of {memory_limit} bytes",
                             code=codes.INVALID_PARAMETER)
    return Requests(cpu, memory)
