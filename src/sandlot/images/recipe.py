"""Image recipes: TOML files describing a Debian-based image (see docs/images.md)."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sandlot.errors import InvalidRequest, NotFound


class Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str
    tags: list[str] = Field(default_factory=list)
    from_: str | None = Field(default=None, alias="from")
    suite: str = "bookworm"
    variant: str = "minbase"
    packages: list[str] = Field(default_factory=list)
    run: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cmd: list[str] | None = None
    working_dir: str | None = None
    smoke_test: list[str] = Field(default_factory=list)
    # Where it was read from (not part of the format): finds sibling recipes for ``from``.
    source: Path | None = Field(default=None, exclude=True)
    text: str = Field(default="", exclude=True)

    @field_validator("packages")
    @classmethod
    def _package_names(cls, v: list[str]) -> list[str]:
        for p in v:
            if not p or p.startswith("-") or any(c.isspace() or c == "," for c in p):
                raise ValueError(f"invalid Debian package name {p!r}")
        return v

    @property
    def all_tags(self) -> list[str]:
        return self.tags or [self.name]


def shipped_recipes() -> list[str]:
    """Names of the recipes that come with sandlot."""
    folder = resources.files("sandlot.images").joinpath("recipes")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def parse_recipe(text: str, source: Path | None = None) -> Recipe:
    where = str(source) if source else "recipe"
    try:
        raw = tomllib.loads(text)
        rec = Recipe.model_validate(raw)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidRequest(f"{where}: not valid TOML: {exc}") from exc
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(x) for x in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors()
        )
        raise InvalidRequest(f"{where}: {problems}") from exc
    return rec.model_copy(update={"source": source, "text": text})


def load_recipe(spec: str | Path, *, near: Path | None = None) -> Recipe:
    """A recipe by file path, by name next to ``near`` (a recipe file), or by shipped name."""
    text_spec = str(spec)
    candidates: list[Path] = []
    if text_spec.endswith(".toml") or "/" in text_spec:
        candidates.append(Path(text_spec))
    else:
        if near is not None:
            candidates.append(near.parent / f"{text_spec}.toml")
        shipped = resources.files("sandlot.images").joinpath("recipes", f"{text_spec}.toml")
        candidates.append(Path(str(shipped)))
    for path in candidates:
        if path.is_file():
            return parse_recipe(path.read_text(encoding="utf-8"), path.resolve())
    known = ", ".join(shipped_recipes()) or "none"
    raise NotFound(f"no recipe {text_spec!r} (shipped recipes: {known})")
