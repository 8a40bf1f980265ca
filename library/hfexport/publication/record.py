"""What the Hub records about a model's publication: the branch head, and the commit its open hfexport PR was built from.

The Hub, not the receiver's memory, is the record of what has been exported: the open PR's marker
(`publish.marker_line`) names the source commit it holds. The webhook receiver compares the two when it reconciles
(on start and on a period), so a push that arrived before a restart, or a delivery the Hub gave up on, is found.
"""

from __future__ import annotations

from dataclasses import dataclass

from hfexport.hub import HubRepo
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
    repo = HubRepo(repo_id, base, token)
    head = repo.head()  # None: no such branch; the Hub failing raises SourceError
    if head is None or not with_pr:
        return PublicationRecord(repo_id, head)
    found = find_open_publication(repo_id, base, token, repo)
    if found is None:
        return PublicationRecord(repo_id, head)
    return PublicationRecord(repo_id, head, found.num, found.marker.get("source"))
