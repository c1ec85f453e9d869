"""The live planner: `gpushare live report` (what should change for the queue now) and `gpushare live apply`
(carry it out: one run, for cron, or `--every S`, a service).

The rooms: ``view`` (what the planner sees: ``ClusterView``), ``observe``
(one look at the cluster, shared by the report and apply), ``plan``
(``plan_live``, pure) with ``catalogue``, ``choose``, ``modes``,
``weights``, ``recent`` and ``report`` (the result and its text);
``change`` (the one type of a change of a node); ``state`` (the shared state
file), ``steps`` (pure: what each change in flight does next) and ``apply``
(the side effects); ``sim`` (the live loop in a simulator, for bench/).

One run of apply: observe (Slurm's queue and nodes, the gpushare-relayout
reservations, the shared state file) -> decide (``steps.next_steps``, pure:
what each change in flight does next, which proposals of
``plan.plan_live`` to start) -> execute (``apply``: reservations and the
root relayout job through the Slurm client (``slurm.relayoutjob`` names
them), the live policy and the rendered configuration written atomically
under the state file's lock).

A change of one node goes through these phases, each in the run that sees
its condition, so a change started by one planner host may be finished by
another:

- ``waiting``: the node's lock (reservation ``gpushare-relayout-<node>``) is
  held and no new job starts there; its GPU jobs end by their time limits;
- ``relayout``: the live policy has the node's new layout, the configuration
  is rendered, the root job ``gpushare-relayout-<node>`` runs
  ``gpushare node relayout`` on the node;
- ``done`` / ``failed`` / ``gave_up`` / ``lost``: the lock is deleted and the
  time kept, so ``live.min_dwell`` holds the node back from the next change.

Each side effect is recorded before it is made (``locking`` before the
reservation, ``submitting`` before the live policy, the configuration and the
relayout job), so a run that finds a change a dead planner left finishes or
undoes it: the lock adopted or the intent taken back, the relayout job found
by its name instead of submitted again, the live policy put back when the
change is lost (docs/admins/live-apply.md).
"""
