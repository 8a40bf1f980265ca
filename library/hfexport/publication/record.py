"""What the Hub records about a model's publication: the branch head, and the commit its open hfexport PR was built from.

The Hub, not the receiver's memory, is the record of what has been exported: the open PR's marker
(`publish.marker_line`) names the source commit it holds. The webhook receiver compares the two when it reconciles
(on start and on a period), so a push that arrived before a restart, or a delivery the Hub gave up on, is found.
"""

from __future__ import annotations

from dataclasses import dataclass

from hfexport.errors import SourceError
from hfexport.hub import hub_error
from hfexport.publication.publish import find_open_publication


@dataclass
class PublicationRecord:
    """One repo as the Hub sees it: its branch head, and the open hfexport PR (number, source commit) if any."""

    repo_id: str
    head: str | None
    pr_num: int | None = None
    exported: str | None = None  # the source commit the open PR's marker names

    @property
    def behind(self) -> bool:
        """Whether the branch has moved past what the publication was built from (or nothing was published)."""
        return self.head is not None and self.head != self.exported


def publication_record(repo_id: str, base: str = "main", token: str | None = None, *, with_pr: bool = True
                       ) -> PublicationRecord:
    """Read `repo_id`'s branch head and its open hfexport PR's source commit (two or three Hub calls).

    Raises `SourceError` (one line, no token) when the Hub cannot be read; a missing branch gives `head=None`.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RevisionNotFoundError

    api = HfApi(token=token)
    try:
        head = api.repo_info(repo_id, revision=base, token=token).sha
    except RevisionNotFoundError:
        return PublicationRecord(repo_id, None)
    except Exception as error:  # noqa: BLE001 - one readable line
        raise hub_error(error, repo_id, f"reading {base}", revision=base, token=token) from None
    if not with_pr:
        return PublicationRecord(repo_id, head)
    try:
        found = find_open_publication(repo_id, base, token, api)
    except Exception as error:  # noqa: BLE001
        raise hub_error(error, repo_id, "looking for an open hfexport PR", token=token,
                        error_class=SourceError) from None
    if found is None:
        return PublicationRecord(repo_id, head)
    return PublicationRecord(repo_id, head, found.num, found.marker.get("source"))
