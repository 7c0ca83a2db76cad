"""The directory of an ``.npz`` (zip) archive, checked against its end record and its members' local headers.

Python's :mod:`zipfile` trusts the central directory: it walks the entries until the byte count the end record
gives is used up, never compares the number of entries it found with the count the end record holds, and only
reads a member's local header when that member is opened.  One damaged length field (a comment length of one
entry) therefore makes it list fewer members than the archive holds -- and a dump without its ``lengths`` or its
sampling metadata still loads, with a different answer.  :func:`check_directory` refuses such an archive before
any member is used, from the structures alone (the end records, the central directory and each local header: a
few hundred bytes per member, no member data):

* the end record (and the zip64 end record and locator, when present) agree with each other, sit at the end of
  the file (the comment length covers exactly the bytes after the record) and describe one disk;
* the central directory starts where the end record says and ends where the end record begins; it holds exactly
  the number of entries the end record counts, and those entries fill exactly the size it gives;
* every entry's local header lies before the central directory, starts with ``PK\\x03\\x04`` and carries the
  entry's name (byte for byte);
* the members tile the bytes before the central directory: they start at byte 0, do not overlap, and leave no
  bytes that belong to no entry (only a data descriptor may follow a member that declares one).

Every disagreement is a :class:`fastspec.errors.DumpFormatError` naming the file and what disagrees.
"""
from __future__ import annotations

import struct
import zipfile

from .format import format_error

__all__ = ["check_directory"]

_END = struct.Struct("<4s4H2IH")  # end of central directory record
_END64 = struct.Struct("<4sQ2H2I4Q")  # zip64 end of central directory record (no extensible data)
_LOCATOR = struct.Struct("<4sIQI")  # zip64 end of central directory locator
_ENTRY = struct.Struct("<4s6H3I5H2I")  # central directory entry, before its name, extra field and comment
_LOCAL = struct.Struct("<4s5H3I2H")  # local file header, before its name and extra field
_DESCRIPTOR = (12, 16, 20, 24)  # data descriptor sizes: with or without its signature, 32- or 64-bit sizes
_FIX = "the archive is damaged; re-save it"


def _end_record(path: str, tail: bytes, tail_start: int, file_size: int):
    """``(position, fields)`` of the end record, found as :mod:`zipfile` finds it (the last 22 bytes when they are
    one without a comment, else the last signature in the final 64 KiB), checked to end the file."""
    at = len(tail) - _END.size
    if not (at >= 0 and tail[at:at + 4] == b"PK\x05\x06" and tail[-2:] == b"\0\0"):
        at = tail.rfind(b"PK\x05\x06", max(0, len(tail) - _END.size - (1 << 16)))
        if at < 0 or at + _END.size > len(tail):
            raise format_error(path, f"the zip end record is missing: {_FIX}")
    fields = _END.unpack_from(tail, at)
    pos, comment = tail_start + at, fields[-1]
    if pos + _END.size + comment != file_size:
        raise format_error(path, f"the zip end record at byte {pos} declares a {comment}-byte comment but "
                                 f"{file_size - pos - _END.size} bytes follow it: {_FIX}")
    return pos, fields


def _agrees(short: int, full: int, saturated: int) -> bool:
    """Whether an end record field agrees with its zip64 counterpart (equal, or saturated: "see zip64")."""
    return short in (full, saturated)


def _directory_bounds(path: str, raw, file_size: int):
    """``(entries, cd_start, cd_size)`` from the end record (the zip64 one when present), checked for
    consistency; the central directory must end exactly where the (zip64) end record begins."""
    tail_start = max(0, file_size - _END.size - (1 << 16) - _END64.size - _LOCATOR.size)
    raw.seek(tail_start)
    tail = raw.read(file_size - tail_start)
    pos, (_, disk, cd_disk, here, total, size, start, _) = _end_record(path, tail, tail_start, file_size)
    cd_end, at = pos, pos - tail_start
    if at >= _LOCATOR.size and tail[at - _LOCATOR.size:at - _LOCATOR.size + 4] == b"PK\x06\x07":
        _, disk64, where, disks = _LOCATOR.unpack_from(tail, at - _LOCATOR.size)
        at64 = at - _LOCATOR.size - _END64.size
        if at64 < 0 or tail[at64:at64 + 4] != b"PK\x06\x06":
            raise format_error(path, f"the zip64 end record that the zip64 locator announces is missing: {_FIX}")
        cd_end = tail_start + at64
        (_, rec_size, _, _, disk, cd_disk, here64, total64, size64, start64) = _END64.unpack_from(tail, at64)
        if where != cd_end or rec_size != _END64.size - 12:
            raise format_error(path, f"the zip64 end record at byte {cd_end} disagrees with its locator (which points "
                                     f"to byte {where}) or with its own size ({rec_size}): {_FIX}")
        if not _agrees(total, total64, 0xFFFF):
            raise format_error(path, f"the zip end record counts {total} members but the zip64 end record counts "
                                     f"{total64}: {_FIX}")
        if not (_agrees(size, size64, 0xFFFFFFFF) and _agrees(start, start64, 0xFFFFFFFF)):
            raise format_error(path, f"the zip end record and the zip64 end record disagree on where the central "
                                     f"directory lies (byte {start} or {start64}, {size} or {size64} bytes): {_FIX}")
        if disk64 != 0 or disks > 1 or not _agrees(here, here64, 0xFFFF):
            raise format_error(path, f"the zip64 locator or end record describes a multi-disk archive: {_FIX}")
        here, total, size, start = here64, total64, size64, start64
    if disk != 0 or cd_disk != 0:
        raise format_error(path, f"the zip end record describes a multi-disk archive (this is disk {disk}, the "
                                 f"central directory starts on disk {cd_disk}): {_FIX}")
    if here != total:
        raise format_error(path, f"the zip end record counts {here} members on this disk but {total} in all: {_FIX}")
    if start + size != cd_end:
        raise format_error(path, f"the zip end record puts the central directory at bytes {start}..{start + size} "
                                 f"but it must end at byte {cd_end}, where the end record starts: {_FIX}")
    return total, start, size


def _walk(path: str, cd: bytes, counted: int, listed: int):
    """``[(name bytes, flags)]`` of the central directory's entries, walked as :mod:`zipfile` walks them; their
    number must be what the end record counts and they must fill the directory exactly."""
    entries, pos = [], 0
    while pos < len(cd):
        if pos + _ENTRY.size > len(cd) or cd[pos:pos + 4] != b"PK\x01\x02":
            raise format_error(path, f"the zip central directory's entry {len(entries)} (byte {pos} of it) is not "
                                     f"a directory entry: {_FIX}")
        fields = _ENTRY.unpack_from(cd, pos)
        flags, (n, m, k) = fields[3], fields[10:13]
        entries.append((cd[pos + _ENTRY.size:pos + _ENTRY.size + n], flags))
        pos += _ENTRY.size + n + m + k
    if listed != counted or len(entries) != counted:
        found = listed if listed != counted else len(entries)
        raise format_error(path, f"the zip central directory lists {found} members but its end record counts "
                                 f"{counted}: {_FIX}")
    if pos != len(cd):
        raise format_error(path, f"the zip central directory's {counted} entries take {pos} bytes but its end "
                                 f"record gives it {len(cd)}: {_FIX}")
    return entries


def check_directory(path: str, zf: zipfile.ZipFile, raw, file_size: int) -> list:
    """Check the archive's directory against its end record, its local headers and the file (module docstring);
    ``raw`` is the archive opened for binary reading, ``zf`` the :class:`zipfile.ZipFile` of it.

    Returns, for each member of ``zf.infolist()`` in order, the file offset of its data (after its local header).
    Raises :class:`fastspec.errors.DumpFormatError` naming the file and what disagrees."""
    infos = zf.infolist()
    total, start, size = _directory_bounds(path, raw, file_size)
    if zf.start_dir != start:  # zipfile found the directory somewhere else (prepended bytes): not ours to guess
        raise format_error(path, f"the zip central directory is read at byte {zf.start_dir} but the end record "
                                 f"puts it at byte {start}: {_FIX}")
    raw.seek(start)
    entries = _walk(path, raw.read(size), total, len(infos))
    spans, data = [], []
    for info, (name, flags) in zip(infos, entries, strict=True):
        what = f"member {info.filename!r}"
        at = info.header_offset
        if not 0 <= at <= start - _LOCAL.size:
            raise format_error(path, f"{what}: its local header offset {at} lies outside the members' bytes "
                                     f"(0..{start}): {_FIX}")
        raw.seek(at)
        local = raw.read(_LOCAL.size)
        if local[:4] != b"PK\x03\x04":
            raise format_error(path, f"{what}: no local header at byte {at}, where the central directory puts it: "
                                     f"{_FIX}")
        n, m = _LOCAL.unpack(local)[-2:]
        if raw.read(n) != name:
            raise format_error(path, f"{what}: the local header at byte {at} names another member: {_FIX}")
        begin = at + _LOCAL.size + n + m
        end = begin + info.compress_size
        if end > start:
            raise format_error(path, f"{what}: its data (bytes {begin}..{end}) run into the central directory at "
                                     f"byte {start}: {_FIX}")
        spans.append((at, end, flags & 0x8, info.filename))
        data.append(begin)
    spans.sort()
    pos, descriptor, prev = 0, False, None
    for at, end, has_descriptor, fname in spans + [(start, start, False, None)]:
        gap = at - pos
        if gap < 0:
            raise format_error(path, f"members {prev!r} and {fname!r} overlap (bytes {at}..{pos}): {_FIX}")
        if gap and not (descriptor and gap in _DESCRIPTOR):
            raise format_error(path, f"bytes {pos}..{at} belong to no member the central directory lists (an "
                                     f"entry is missing from it): {_FIX}")
        pos, descriptor, prev = end, has_descriptor, fname
    return data
