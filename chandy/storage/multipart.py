"""S3 multipart uploads: how a sink makes an object appear only when a checkpoint completes.

Object stores have no rename, so the FileSink cannot write a hidden file and rename it at
commit as it does on a disk. It does what Flink's S3 ``RecoverableWriter`` does: a part
file is uploaded as a multipart upload under its final key and left incomplete; S3 shows
nothing under that key (no listing, no GET) until ``CompleteMultipartUpload``, which the
committer calls when the checkpoint holding the upload completes. The upload's id and its
parts' ETags are the committable, kept in the checkpoint: a restore completes it again
(a second completion of a completed upload is a no-op, or ``NoSuchUpload`` with the object
there) or, for an upload no checkpoint holds, aborts it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from chandy.errors import StorageError
from chandy.storage.filesystem import DEFAULT_OBJECT_STORE, S3_SCHEMES, FsspecFileSystem, ObjectStoreOptions

log = logging.getLogger(__name__)

#: Every part but the last must have at least 5 MiB (S3's rule); 16 MiB keeps the count of
#: requests small and a part's buffer modest.
PART_BYTES = 16 << 20


def is_s3(uri: str) -> bool:
    """Whether ``uri`` names an S3 object or prefix (``s3://`` or ``s3a://``)."""
    scheme, sep, _ = uri.partition("://")
    return bool(sep) and scheme.lower() in S3_SCHEMES


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/key`` -> ``("bucket", "some/key")``; a clear error without a bucket."""
    if not is_s3(uri):
        raise StorageError(f"'{uri}' is not an s3:// URI")
    bucket, _, key = uri.partition("://")[2].partition("/")
    if not bucket:
        raise StorageError(f"'{uri}' names no bucket: write s3://<bucket>/<path>")
    return bucket, key


@dataclass(frozen=True)
class MultipartUpload:
    """An object uploaded but not completed: nothing is visible at ``uri`` until it is."""

    uri: str
    upload_id: str
    #: ``(part number, ETag)`` of every part, in order: what completing it names.
    parts: tuple[tuple[int, str], ...]


class S3Uploads:
    """Multipart uploads to the S3 store that ``object_store`` reaches."""

    def __init__(self, object_store: ObjectStoreOptions = DEFAULT_OBJECT_STORE) -> None:
        self._fs = FsspecFileSystem("s3", object_store)

    def _s3(self, what: str, uri: str, method: str, **kwargs: Any) -> dict[str, Any]:
        raw = self._fs.raw
        response: dict[str, Any] = self._fs.call(what, uri, lambda: raw.call_s3(method, **kwargs))
        return response

    def start(self, uri: str) -> str:
        """Begin an upload to ``uri``; its id (nothing is visible at ``uri`` yet)."""
        bucket, key = split_s3_uri(uri)
        started = self._s3("starting an upload of", uri, "create_multipart_upload", Bucket=bucket, Key=key)
        return str(started["UploadId"])

    def upload(self, local_path: str, uri: str) -> MultipartUpload:
        """Upload the local file ``local_path`` to ``uri`` without completing it; a failed
        upload is aborted (nothing of it stays in the bucket)."""
        bucket, key = split_s3_uri(uri)
        upload_id = self.start(uri)
        parts = []
        try:
            for number, chunk in enumerate(_chunks(local_path), start=1):
                answer = self._s3(
                    "uploading a part of",
                    uri,
                    "upload_part",
                    Bucket=bucket,
                    Key=key,
                    UploadId=upload_id,
                    PartNumber=number,
                    Body=chunk,
                )
                parts.append((number, str(answer["ETag"])))
        except BaseException:
            self.abort(uri, upload_id)
            raise
        return MultipartUpload(uri, upload_id, tuple(parts))

    def complete(self, upload: MultipartUpload) -> bool:
        """Make the object visible; False if it was completed before (a replayed commit).
        :class:`FileNotFoundError` if neither the upload nor the object exists any more."""
        bucket, key = split_s3_uri(upload.uri)
        try:
            self._s3(
                "completing the upload of",
                upload.uri,
                "complete_multipart_upload",
                Bucket=bucket,
                Key=key,
                UploadId=upload.upload_id,
                MultipartUpload={"Parts": [{"PartNumber": n, "ETag": etag} for n, etag in upload.parts]},
            )
        except FileNotFoundError:  # NoSuchUpload: completed (or aborted) before
            if self._fs.exists(upload.uri):
                return False
            raise
        return True

    def abort(self, uri: str, upload_id: str) -> None:
        """Drop an upload and its parts; one already gone is not an error."""
        bucket, key = split_s3_uri(uri)
        try:
            self._s3(
                "aborting the upload of",
                uri,
                "abort_multipart_upload",
                Bucket=bucket,
                Key=key,
                UploadId=upload_id,
            )
        except FileNotFoundError:
            pass

    def in_progress(self, prefix_uri: str) -> Iterator[tuple[str, str]]:
        """``(uri, upload id)`` of every upload not completed under ``prefix_uri``."""
        bucket, prefix = split_s3_uri(prefix_uri)
        scheme = prefix_uri.partition("://")[0]
        request: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix.rstrip("/") + "/" if prefix else ""}
        while True:
            page = self._s3("listing the uploads under", prefix_uri, "list_multipart_uploads", **request)
            for upload in page.get("Uploads") or ():
                yield f"{scheme}://{bucket}/{upload['Key']}", str(upload["UploadId"])
            if not page.get("IsTruncated"):
                return
            request["KeyMarker"] = page.get("NextKeyMarker")
            request["UploadIdMarker"] = page.get("NextUploadIdMarker")

    def exists(self, uri: str) -> bool:
        return self._fs.exists(uri)


def _chunks(local_path: str) -> Iterator[bytes]:
    """The file in parts of :data:`PART_BYTES` (one, possibly empty, for a small file)."""
    size = os.path.getsize(local_path)
    with open(local_path, "rb") as source:
        if size == 0:
            yield b""
            return
        while chunk := source.read(PART_BYTES):
            yield chunk
