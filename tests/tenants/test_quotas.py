"""``check_quota`` on its own: what counts, and the edges of each bound."""

from __future__ import annotations

import pytest

from sandlot.server.models import SandboxRecord, SandboxState, utcnow
from sandlot.server.tenancy.principal import ADMIN, Principal, Quota
from sandlot.server.tenancy.quotas import QuotaExceeded, check_quota

GI = 1 << 30


def rec(owner: str | None, state: SandboxState = SandboxState.RUNNING,
        cpu: str = "1", memory: str = "1Gi") -> SandboxRecord:
    now = utcnow()
    return SandboxRecord(id=f"{owner}-{state}-{cpu}", state=state, image_uri="base",
                         entrypoint=[], execd_token=None, created_at=now,
                         last_transition_at=now, updated_at=now, owner=owner,
                         resource_limits={"cpu": cpu, "memory": memory})


TEAM = Principal("team", quota=Quota(sandboxes=3, cpu=2.0, memory=2 * GI))


def test_only_the_tenants_live_sandboxes_count() -> None:
    records = [rec("team"), rec("other", cpu="8", memory="8Gi"), rec(None, cpu="8"),
               rec("team", SandboxState.FAILED, cpu="8"),
               rec("team", SandboxState.TERMINATED, cpu="8")]
    check_quota(TEAM, records, 1.0, GI)  # fills cpu and memory exactly
    with pytest.raises(QuotaExceeded, match="cpu quota of 2 cores"):
        check_quota(TEAM, records, 1.001, GI)
    with pytest.raises(QuotaExceeded, match="memory quota of 2Gi"):
        check_quota(TEAM, records, 0.5, GI + 1)


def test_count_and_unbounded_sandboxes() -> None:
    records = [rec("team", cpu="100m", memory="64Mi") for _ in range(3)]
    for r, i in zip(records, range(3), strict=True):
        r.id = f"r{i}"
    with pytest.raises(QuotaExceeded, match="3 live sandboxes, its quota of 3"):
        check_quota(TEAM, records, 0.1, GI // 16)
    with pytest.raises(QuotaExceeded, match="needs resourceLimits.cpu"):
        check_quota(TEAM, [], None, GI)  # no cpu limit cannot fit a cpu quota
    check_quota(Principal("free"), records, None, None)  # no quota: anything goes
    check_quota(ADMIN, records, 100.0, 100 * GI)  # the admin has none
    assert QuotaExceeded("x").status == 429
