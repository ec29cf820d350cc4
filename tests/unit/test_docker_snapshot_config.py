"""The Docker runtime's commit request: nothing of execd's secrets or sandlot's own labels
is baked into a snapshot's image, and the image's own settings are kept."""

from __future__ import annotations

from sandlot.runtime.docker.snapshots import commit_config, image_ref


def test_commit_config_drops_execd_secrets_and_keeps_the_image_settings() -> None:
    container = {"Config": {
        "Env": ["PATH=/usr/bin", "FOO=bar", "SANDLOT_EXECD_TOKEN=s3cret",
                "SANDLOT_BUNDLE=/opt/sandlot", "PYTHONHOME=/opt/sandlot/py",
                "SANDLOT_EXECD_PRIVATE_ENV=SANDLOT_BUNDLE,PYTHONHOME,SANDLOT_EXECD_TOKEN"],
        "Labels": {"io.sandlot.sandbox-id": "abc", "io.sandlot.warm": "_pool-1",
                   "team": "ml"},
        "Entrypoint": ["/opt/sandlot/python", "-m", "sandlot.execd"], "User": "0:0",
    }}
    image = {"Config": {"Entrypoint": None, "Cmd": ["/bin/sh"], "User": "app",
                        "WorkingDir": "/srv", "Labels": {"maintainer": "me"}}}
    conf = commit_config(container, image, "snap-1")

    env = conf["Env"]
    assert "FOO=bar" in env and "PATH=/usr/bin" in env  # the sandbox's env is kept
    assert not [e for e in env if "s3cret" in e or "/opt/sandlot" in e]
    # set empty so that the engine cannot add the container's values back
    for key in ("SANDLOT_EXECD_TOKEN", "SANDLOT_BUNDLE", "PYTHONHOME",
                "SANDLOT_EXECD_PRIVATE_ENV"):
        assert f"{key}=" in env
    assert conf["Labels"]["io.sandlot.sandbox-id"] == ""
    assert conf["Labels"]["io.sandlot.warm"] == ""
    assert conf["Labels"]["io.sandlot.snapshot-id"] == "snap-1"
    assert conf["Labels"]["team"] == "ml" and conf["Labels"]["maintainer"] == "me"
    assert (conf["Cmd"], conf["User"], conf["WorkingDir"]) == (["/bin/sh"], "app", "/srv")
    assert conf["Entrypoint"] == []  # not execd's (the engine fills a missing one from it)
    assert image_ref("snap-1") == "sandlot-snapshots:snap-1"
