"""The one place that runs Slurm commands (sacct, sshare, sacctmgr) and parses what they print.

Parsers are pure and tested on recorded output (tests/data/slurm/); the
query functions take the Runner made at the entry point. Nothing here uses a
shell: every command is an argument list.
"""

from .parsable import SlurmParseError, parse_duration, parse_time, parse_tres
from .sacct import FileSource, JobRecord, JobSource, PyslurmSource, SacctSource, parse_json, parse_parsable2
from .sshare import ShareRow

__all__ = ["FileSource", "JobRecord", "JobSource", "PyslurmSource", "SacctSource", "ShareRow", "SlurmParseError",
           "parse_duration", "parse_json", "parse_parsable2", "parse_time", "parse_tres"]
