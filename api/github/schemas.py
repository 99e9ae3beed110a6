"""API shapes of the GitHub integration: a submitter asking for a pull request's evidence."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from coldbench.api.github.config import FULL_NAME_PATTERN

# OWNER/REPO#N, optionally @SHA: the head commit its asker reviewed (the form's way to name it).
_PULL_REQUEST = re.compile(
    FULL_NAME_PATTERN.removesuffix("$") + r"#([1-9][0-9]{0,9})(?:@([0-9a-f]{7,40}))?$"
)
# An option's name and its text: one line, bounded.
OptionName = Annotated[str, Field(pattern=r"^[a-z_]{1,40}$")]
OptionText = Annotated[str, Field(pattern=r"^[^\x00-\x1f\x7f]{1,500}$")]


class PullRequestAsk(BaseModel):
    """`coldbench submit --pr OWNER/REPO#N` and the form's pull-request field: the options of a
    `/coldbench` comment, by the builder's names, as text."""

    model_config = ConfigDict(extra="forbid")

    pull_request: str = Field(pattern=_PULL_REQUEST.pattern, max_length=160)
    options: dict[OptionName, OptionText] = Field(default_factory=dict, max_length=20)

    @property
    def full_name(self) -> str:
        return self.pull_request.rpartition("#")[0]

    @property
    def number(self) -> int:
        return int(self.pull_request.rpartition("#")[2].partition("@")[0])

    @property
    def head_sha(self) -> str | None:
        """The head named after `@`, else the `head` option's (`--head`), else None."""
        return self.pull_request.rpartition("@")[2] if "@" in self.pull_request else None

    @property
    def name(self) -> str:
        """OWNER/REPO#N, without a named head."""
        return self.pull_request.partition("@")[0]
