"""Joining a site's own Slurm configuration: what the product owns, merges and leaves.

``conf`` reads slurm.conf and gres.conf lines as Slurm does (keys case-insensitive, several
``Key=Value`` pairs on a line, quoted values, ``#`` comments); ``merge`` plans the merged
slurm.conf and the include it loads, ``gres`` the merged gres.conf, ``jobsubmit`` what becomes of
a site's job_submit.lua, ``jobcontainer`` the merged job_container.conf, ``includes`` the files slurm.conf
includes (all pure: texts in, texts and a list of changes out); ``install`` reads the files (the included
ones too, never written) and writes its own, with a backup of every original for ``gpushare install
--rollback``.
"""
