"""When a job is due: the forms a spec's ``deadline:`` takes, and the instant each one means.

* an ISO-8601 duration from submission: ``PT4H``, ``P1DT30M``;
* a clock time ``HH:MM`` (or ``HH:MM:SS``): the next such time after submission, in the spec's
  ``timezone:`` (UTC when it has none), or in the zone it names (``06:00 Europe/Amsterdam``). The Airflow DAG's ``deadline`` parameter takes ``HH:MM``
  too, read in the DAG's timezone by the provider before the spec is validated;
* an ISO-8601 instant with an offset: ``2026-11-30T06:00:00+00:00``;
* a local date and time, ``2026-11-30T06:00``, in the spec's ``timezone:``;
* an instant with its IANA zone name: ``2026-11-30T06:00 Europe/Amsterdam`` or RFC 9557's
  ``2026-11-30T06:00[Europe/Amsterdam]`` (with an offset too, the two must agree).

Zone names are IANA's (``Europe/Amsterdam``, ``America/New_York``, ``UTC``), looked up in the
time-zone database :mod:`zoneinfo` reads: reference data, like a table, not the clock. A local time
that a clock change skips or repeats is read with its first offset (``fold=0``). Every failure is a
:class:`~qosflow.core.errors.SpecError` naming the field; an instant after the year 9999 (where
the calendar stops) is refused in those words rather than failing.
"""

from __future__ import annotations

import re
import zoneinfo
from datetime import UTC, date, datetime, timedelta, tzinfo
from typing import Any

from qosflow.core.errors import SpecError

_ISO_DURATION = re.compile(
    r"^P(?!$)(?:(?P<days>\d+(?:\.\d+)?)D)?"
    r"(?:T(?=\d)(?:(?P<hours>\d+(?:\.\d+)?)H)?(?:(?P<minutes>\d+(?:\.\d+)?)M)?"
    r"(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?$"
)
_CLOCK = re.compile(r"^(?P<h>[01]?\d|2[0-3]):(?P<m>[0-5]\d)(?::(?P<s>[0-5]\d))?$")
_DATE_ONLY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_ZONED = re.compile(r"^(?P<when>\S+?)(?:\[(?P<bracket>[^\]]+)\]|\s+(?P<named>\S+))$")
FORMS = (
    "an ISO-8601 instant (2026-11-30T06:00:00+00:00, or 2026-11-30T06:00 with timezone:), "
    "a clock time HH:MM, or a duration like PT4H"
)
"""What a deadline may be, in the words of every message that refuses one."""


def parse_iso_duration(text: str) -> timedelta:
    """Parse an ISO-8601 duration of days, hours, minutes and seconds (``PT4H``, ``P1DT30M``).

    Raises:
        ValueError: When the text is not such a duration, or one too long for a calendar.
    """
    match = _ISO_DURATION.match(text.strip())
    if match is None:
        raise ValueError(f"must be an ISO-8601 duration like PT4H (got {text!r})")
    parts = {k: float(v) for k, v in match.groupdict().items() if v is not None}
    try:
        return timedelta(**parts)
    except OverflowError:
        raise ValueError(f"is after the year 9999 (got {text!r})") from None


def zone(name: str) -> tzinfo:
    """The IANA time zone ``name`` (``Europe/Amsterdam``).

    Raises:
        ValueError: When ``name`` is not an IANA zone name.
    """
    text = name.strip()
    if text.upper() == "UTC":
        return UTC
    try:
        return zoneinfo.ZoneInfo(text)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(
            f"is not an IANA zone name like Europe/Amsterdam or America/New_York (got {name!r})"
        ) from None


def deadline_form(value: Any) -> datetime | str:
    """Check the shape of a ``deadline:`` value at the boundary (no zone or clock needed yet).

    Returns:
        A datetime (perhaps naive: ``timezone:`` gives its zone), or the text of a duration, a
        clock time or a zoned instant, resolved later by :func:`resolve_deadline`.

    Raises:
        ValueError: A value that is none of the :data:`FORMS`, in words for pydantic to carry.
    """
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        raise ValueError(_not_text(value))
    text = value.strip()
    if text.startswith("P"):
        parse_iso_duration(text)
        return text
    if _CLOCK.match(text):
        return text
    if _DATE_ONLY.match(text):
        raise ValueError(f"must include a time of day, not only a date (got {value!r})")
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        pass
    when, named = _split_zone(text)
    try:
        if not _CLOCK.match(when):
            datetime.fromisoformat(when)
    except ValueError:
        raise ValueError(f"must be {FORMS} (got {value!r})") from None
    if named is None:  # pragma: no cover - the whole text parsed above
        raise ValueError(f"must be {FORMS} (got {value!r})")
    zone(named)
    return text


def _not_text(value: Any) -> str:
    """Why a deadline that is neither text nor a datetime is refused (YAML's dates and numbers)."""
    if isinstance(value, date):
        return f"must include a time of day, not only a date (got {value.isoformat()})"
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 24 * 60:
        clock = "{:02d}:{:02d}".format(*divmod(value, 60))
        return (
            f"must be {FORMS} (got the number {value}; for the clock time {clock}, quote it: "
            f'"{clock}": YAML reads an unquoted {clock} as a number in base 60)'
        )
    return f"must be {FORMS} (got {value!r})"


def _split_zone(text: str) -> tuple[str, str | None]:
    """``(instant, zone name)`` of ``2026-11-30T06:00 Europe/Amsterdam`` or ``...[Zone]``."""
    match = _ZONED.match(text)
    if match is None:
        return text, None
    return match["when"], match["bracket"] or match["named"]


def resolve_deadline(form: datetime | str, *, timezone: str | None, now: datetime) -> datetime:
    """The instant a :func:`deadline_form` means, submitted at ``now``.

    Raises:
        SpecError: ``deadline`` or ``timezone``: a naive time without a zone, a zone that is not
            IANA's, an offset that contradicts the zone, or an instant after the year 9999.
    """
    try:
        local = UTC if timezone is None else zone(timezone)
    except ValueError as exc:
        raise SpecError("timezone", str(exc)) from None
    try:
        return _instant(form, local, timezone, now).astimezone(UTC)
    except OverflowError:
        raise SpecError("deadline", f"is after the year 9999 (got {str(form)!r})") from None
    except ValueError as exc:
        raise SpecError("deadline", str(exc)) from None


def _instant(form: datetime | str, local: tzinfo, timezone: str | None, now: datetime) -> datetime:
    if isinstance(form, datetime):
        return _aware(form, local, timezone)
    if form.startswith("P"):
        return now + parse_iso_duration(form)
    clock = _CLOCK.match(form)
    if clock is not None:
        return _next_clock(clock, local, now)
    when, named = _split_zone(form)
    clock = _CLOCK.match(when)
    if clock is not None and named is not None:  # 06:00 Europe/Amsterdam
        return _next_clock(clock, zone(named), now)
    return _zoned(datetime.fromisoformat(when), named, form)


def _aware(moment: datetime, local: tzinfo, timezone: str | None) -> datetime:
    if moment.tzinfo is not None:
        return moment
    if timezone is None:
        raise ValueError(
            "must be timezone-aware: end it in an offset like +00:00, or name its zone with "
            f"timezone: Europe/Amsterdam (got {moment.isoformat()!r})"
        )
    return moment.replace(tzinfo=local)


def _next_clock(clock: re.Match[str], local: tzinfo, now: datetime) -> datetime:
    """The first ``HH:MM[:SS]`` in ``local`` strictly after ``now`` (the provider's rule)."""
    here = now.astimezone(local)
    due = here.replace(
        hour=int(clock["h"]), minute=int(clock["m"]), second=int(clock["s"] or 0), microsecond=0
    )
    if due <= here:
        due += timedelta(days=1)  # wall-clock arithmetic: 06:00 the next day, whatever the offset
    return due


def _zoned(moment: datetime, name: str | None, text: str) -> datetime:
    if name is None:  # pragma: no cover - deadline_form keeps only zoned text
        raise ValueError(f"must be {FORMS} (got {text!r})")
    place = zone(name)
    if moment.tzinfo is None:
        return moment.replace(tzinfo=place)
    there = moment.astimezone(place)
    if there.utcoffset() != moment.utcoffset():
        raise ValueError(
            f"the offset {moment.strftime('%z')} is not {name}'s at that time "
            f"({there.strftime('%z')}): give one of the two (got {text!r})"
        )
    return moment
