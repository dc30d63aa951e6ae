"""Versions and ranges with npm's semantics (the ``node-semver`` port).

Published versions are exact (``1.2.3``, ``2.0.0-beta.1``); ranges (``^1.2``, ``~1.2.3``,
``>=1.0 <2``, ``1.x``, ``*``) are only for install. As in npm, a range never picks a
prerelease unless it names one of the same ``major.minor.patch``, and ``latest`` is the
highest stable version.
"""

from __future__ import annotations

import nodesemver

from conch.marketplace.errors import invalid, not_found

LATEST = "latest"


def exact(version: str) -> str:
    """The cleaned exact version (``v1.2.3`` → ``1.2.3``), or a 400 saying what is wrong."""
    text = version.strip()
    cleaned = nodesemver.valid(text, False)
    if cleaned is not None:
        return str(cleaned)
    if text == LATEST or nodesemver.valid_range(text, False) is not None:
        raise invalid(
            f"version {version!r} is a range; publish an exact version such as 1.2.3 "
            "(ranges are for install)",
            "version",
        )
    raise invalid(
        f"version {version!r} is not a semantic version (MAJOR.MINOR.PATCH[-PRERELEASE])",
        "version",
    )


def is_prerelease(version: str) -> bool:
    return bool(nodesemver.make_semver(version, False).prerelease)


def newest(versions: list[str]) -> str | None:
    """The version search shows: the highest stable one, else the highest prerelease."""
    if not versions:
        return None
    stable = [v for v in versions if not is_prerelease(v)]
    return str(nodesemver.rsort(stable or list(versions), False)[0])


def next_patch(versions: list[str]) -> str:
    """The version a publish without one gets: ``1.0.0`` first, then the next patch of the
    highest version published (``1.3.0-beta.1`` → ``1.3.0``, as ``npm version patch``)."""
    if not versions:
        return "1.0.0"
    highest = nodesemver.rsort(list(versions), False)[0]
    return str(nodesemver.inc(highest, "patch", False))


def resolve(name: str, versions: list[str], wanted: str | None) -> str:
    """The version of ``name`` to install for ``wanted`` (exact, range, ``latest`` or none)."""
    text = (wanted or "").strip()
    if not versions:
        raise not_found(f"no agent named {name!r}", "name")
    if text in ("", LATEST):
        stable = [v for v in versions if not is_prerelease(v)]
        if not stable:
            shown = ", ".join(nodesemver.rsort(list(versions), False)[:5])
            raise not_found(
                f"{name} has only prerelease versions ({shown}); ask for one by its exact version",
                "version",
            )
        return str(nodesemver.rsort(stable, False)[0])
    valid = nodesemver.valid(text, False)
    if valid is not None:
        cleaned = str(valid)
        if cleaned in versions:
            return cleaned
        raise not_found(f"{name}@{cleaned} is not published ({_available(versions)})", "version")
    if nodesemver.valid_range(text, False) is None:
        raise invalid(
            f"version {wanted!r} is neither a version, a semver range nor 'latest'", "version"
        )
    match = nodesemver.max_satisfying(list(versions), text, False)
    if match is None:
        raise not_found(
            f"no version of {name} matches {text!r} ({_available(versions)})", "version"
        )
    return str(match)


def _available(versions: list[str]) -> str:
    ordered = nodesemver.rsort(list(versions), False)
    shown = ", ".join(ordered[:8])
    more = f" and {len(ordered) - 8} more" if len(ordered) > 8 else ""
    return f"published: {shown}{more}"


def sort_desc(versions: list[str]) -> list[str]:
    return [str(v) for v in nodesemver.rsort(list(versions), False)]
