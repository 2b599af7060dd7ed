"""Local search over whole groups, on true micro-batch costs (samples that share a rank).

`groups.place_groups` balances the groups' marginal costs over the ranks, then packs each
rank. Under a calibrated model a micro-batch's cost is not the sum of its samples' marginal
costs (the token curve has steps), so the packed ranks came out 0.7-2.9% apart under the
H200 profile on RL-like batches in groups of 2-16, where samples alone balance within
0.02%. This pass works on the packed placement: for each pair of a heavy rank A and a light
rank B (as `refine` pairs them), it prices exactly

- every move of one of A's groups to B, and
- swaps of a group of A with one of B (the two whose marginal costs lie either side of
  half the gap, as `refine.swap_partners` finds them),

and applies the one that lowers the pair's maximum the most. A group's samples sit in one
or more micro-batches of its rank (its pieces, largest first). A move sends its i-th piece
into B's i-th roomiest micro-batch; a swap sends each group's j-th piece into the
micro-batch of the other's (j mod its piece count)-th piece, so the largest take the room
the largest left. No micro-batch may be left empty or go over the cap. Costs are the
placement's own integers, so every priced change is what the placement gets: sweeps cannot
cycle, and every process gets the same result. Additive and separable costs only (a generic
cost would need every candidate micro-batch evaluated).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from costmodel.scheduler.refine import BinState, local_search, pair_ranks, swap_partners
from costmodel.scheduler.sorting import first_min_per_pair, run_starts, segments, stable_order

__all__ = ["group_local_search"]

_NONE = np.iinfo(np.int64).max
# Sweeps per search: on bench_grouped-like batches (n 2k-65k, dp 16-1024, groups of 2-16)
# the first 16 took all but 0.1% of what 64 reached (makespan), in 6-60% less time.
_MAX_SWEEPS = 16


def group_local_search(st: BinState, groups: np.ndarray) -> int:
    """Balance ``st`` by moving and swapping whole groups (``groups[i]`` is sample i's dense
    group id); returns the number of changes applied. Not for a generic cost: 0."""
    if not (st.additive or st.separable):
        return 0
    st.tabulate_tokens()  # each sweep prices every group's pieces on the token curve
    pc = _Pieces(st, groups)
    return local_search(st, lambda st_, tol, fold: _sweep(st_, pc, tol, fold),
                        max_sweeps=_MAX_SWEEPS)


class _Pieces:
    """Every group cut into pieces (its samples in one micro-batch), kept up to date: a
    sweep cuts again only the groups it changed (cutting every group each sweep, a sort of
    every sample, took about a third of a sweep at 65,536 samples).

    Group g owns entries ``start[g]:start[g+1]`` of ``samples`` and the same range of piece
    slots: its ``size[g]`` pieces (never more than its samples) sit in the first slots of
    it, largest first (ties: lower micro-batch), each piece's samples together."""

    def __init__(self, st: BinState, groups: np.ndarray) -> None:
        self.samples = stable_order(groups)  # by group; within one, by piece once cut
        n_groups = int(groups.max()) + 1 if groups.size else 0
        self.start = np.zeros(n_groups + 1, dtype=np.int64)
        np.cumsum(np.bincount(groups, minlength=n_groups), out=self.start[1:])
        # Per group: its samples' summed marginal costs (to find swap partners; integer
        # sums, exact in any order), and its groups by them (`swap_partners`'s ``by_cost``).
        self.q = np.zeros(n_groups, dtype=np.int64)
        np.add.at(self.q, groups, st.q)
        self.by_cost = stable_order(self.q)
        self.size = np.zeros(n_groups, dtype=np.int64)  # per group: its number of pieces
        self.rank = np.zeros(n_groups, dtype=np.int64)  # per group
        # Per piece slot: where its samples start in ``samples``, its micro-batch, tokens,
        # summed parts (`BinState.part`) and samples.
        self.piece_start, self.bin, self.tokens, self.part, self.count = (
            np.zeros(groups.size, dtype=np.int64) for _ in range(5))
        self.cut(st, np.arange(n_groups))

    def cut(self, st: BinState, groups_: np.ndarray) -> None:
        """Cut the groups ``groups_`` (ascending, distinct) into pieces as they lie now."""
        if groups_.size == 0:  # no samples at all
            return
        seg, j = segments(np.diff(self.start)[groups_])
        entries = self.start[groups_][seg] + j  # their samples' entries, group by group
        samples = self.samples[entries]
        bins = st.bin_of[samples]
        # One integer key per sample, group then micro-batch: its runs are the pieces, so the
        # groups and micro-batches of the pieces come from the key at their starts (no pass
        # over every sample for them).
        k = st.dp * st.m
        key = seg * k + bins
        order = np.argsort(key, kind="stable")
        samples, key = samples[order], key[order]
        piece_start = np.flatnonzero(run_starts(key))
        piece_group, bin_ = np.divmod(key[piece_start], k)
        tokens = np.add.reduceat(st.lengths[samples], piece_start)
        part = np.add.reduceat(st.part[samples], piece_start)
        count = np.diff(np.append(piece_start, samples.size))
        # By group, then most tokens (ties: the lower micro-batch, as cut): one integer key.
        by_size = np.argsort(piece_group * (int(tokens.max()) + 1) - tokens, kind="stable")
        size = np.bincount(piece_group, minlength=groups_.size)
        seg_p, place = segments(size)
        slot = self.start[groups_][seg_p] + place
        # Each group's samples again, piece after piece in that order.
        p_seg, p_j = segments(count[by_size])
        self.samples[entries] = samples[piece_start[by_size][p_seg] + p_j]
        self.piece_start[slot] = entries[np.cumsum(count[by_size]) - count[by_size]]
        self.bin[slot], self.tokens[slot] = bin_[by_size], tokens[by_size]
        self.part[slot], self.count[slot] = part[by_size], count[by_size]
        self.size[groups_] = size
        self.rank[groups_] = self.bin[self.start[groups_]] // st.m


class _Side(NamedTuple):
    """What a change does to one rank: per candidate, its load change and whether legal."""

    delta: np.ndarray
    ok: np.ndarray


class _Change(NamedTuple):
    """Per slot, what its micro-batch gains (negative: loses) in tokens, summed parts
    (`BinState.part`) and samples."""

    tokens: np.ndarray
    part: np.ndarray
    count: np.ndarray  # type: ignore[assignment]  # shadows tuple.count, which no one calls


def _carried(pc: _Pieces, pieces: np.ndarray) -> _Change:
    """What ``pieces`` carry: gathered once a sweep for a side's pieces, which each kind of
    change prices again."""
    return _Change(pc.tokens[pieces], pc.part[pieces], pc.count[pieces])


def _left(out: _Change) -> _Change:
    """Each slot loses its piece, and nothing comes in."""
    return _Change(-out.tokens, -out.part, -out.count)


def _swapped(out: _Change, coming: _Change, in_slot: np.ndarray) -> _Change:
    """Each slot loses its piece (``out``) and gains the pieces (``coming``) that go into it
    (``in_slot``: each coming piece's slot; several may share one)."""
    def into(values: np.ndarray) -> np.ndarray:  # float sums of integers under 2**53: exact
        return np.bincount(in_slot, weights=values, minlength=out.tokens.size).astype(np.int64)

    return _Change(into(coming.tokens) - out.tokens, into(coming.part) - out.part,
                   into(coming.count) - out.count)


def _side(st: BinState, slot_bin: np.ndarray, slots: _Slots, change: _Change) -> _Side:
    """Price one rank's side of each candidate. Candidate c owns the micro-batches
    ``slot_bin[slots.start[c]:slots.start[c+1]]``, each changing by ``change``."""
    count = st.count[slot_bin] + change.count
    fill = st.fill[slot_bin]
    d_tok = change.tokens
    legal = (count >= 1) & ((fill + d_tok <= st.cap) | (count == 1))
    # An illegal slot's price is never read (its candidate is dropped): price it at the cap,
    # on the token table, not on the curve.
    d_tok = np.where(legal, d_tok, np.minimum(d_tok, st.cap - fill))
    delta = st.cost_change(slot_bin, fill, d_tok, change.part)
    # Per candidate, from running sums (int64 differences: exact) and a count of its illegal
    # slots (few): numpy's reduceat took 1.3x and 4x as long.
    sums = np.diff(np.concatenate(([0], np.cumsum(delta)))[slots.start])
    illegal = np.bincount(slots.group[~legal], minlength=sums.size)
    return _Side(sums, illegal == 0)


class _Slots(NamedTuple):
    """The pieces of some groups, each group's largest first, group after group: the slots a
    change of those groups fills (a piece leaves its micro-batch, another may come in)."""

    pieces: np.ndarray
    start: np.ndarray  # where each group's pieces start in ``pieces`` (and an end)
    group: np.ndarray  # per piece: its group's place in the groups asked for
    place: np.ndarray  # per piece: its place among its group's pieces

    def swapped_in(self, other: _Slots) -> np.ndarray:
        """For a swap of each group with the other's (the same places in their lists): the
        slot of the other group's piece that each of these pieces goes into, its j-th into
        the (j mod their piece count)-th, so the largest take the room the largest left."""
        return other.start[self.group] + self.place % np.diff(other.start)[self.group]


def _slots(pc: _Pieces, groups_: np.ndarray) -> _Slots:
    group, place = segments(pc.size[groups_])
    return _Slots(pc.start[groups_][group] + place, np.append(0, np.cumsum(pc.size[groups_])),
                  group, place)


def _sweep(st: BinState, pc: _Pieces, tol: float, fold: bool) -> int:
    """One sweep of group moves and swaps over all rank pairs; returns changes applied."""
    pairs = pair_ranks(st.load, tol, fold)
    if pairs is None:
        return 0
    a_ranks, b_ranks, gap, pair_a, pair_b = pairs
    on_a = pair_a[pc.rank] >= 0
    pair_of = np.where(on_a, pair_a[pc.rank], pair_b[pc.rank])
    a = np.flatnonzero(on_a)
    pa = pair_of[a]
    load_a, load_b = st.load[a_ranks[pa]], st.load[b_ranks[pa]]

    # Group a leaves A (its pieces' micro-batches lose them): shared by moves and swaps.
    sa = _slots(pc, a)
    bin_a, out_a = pc.bin[sa.pieces], _carried(pc, sa.pieces)
    leave = _side(st, bin_a, sa, _left(out_a))

    # Moves: a's i-th piece into B's i-th roomiest micro-batch.
    m = st.m
    roomy = np.argsort(st.fill.reshape(st.dp, m), axis=1, kind="stable") + (np.arange(st.dp) * m)[:, None]
    move = _side(st, roomy[b_ranks[pa[sa.group]], sa.place], sa, out_a)
    # Per kind of change (the move, then each swap partner), each group's new pair maximum.
    values = [np.where(leave.ok & move.ok,
                       np.maximum(load_a + leave.delta, load_b + move.delta), _NONE)]
    partners = []

    # Swaps: a with a group h of B, each piece into the other's pieces' micro-batches.
    pair_b_of = np.where(on_a, -1, pair_of)
    for h in swap_partners(pa, pc.q[a], gap[pa], pair_b_of, pc.q, int(gap.max()), pc.by_cost):
        sh = _slots(pc, h)
        out_h = _carried(pc, sh.pieces)
        into_a = _side(st, bin_a, sa, _swapped(out_a, out_h, sh.swapped_in(sa)))
        into_b = _side(st, pc.bin[sh.pieces], sh, _swapped(out_h, out_a, sa.swapped_in(sh)))
        ok = (pair_b_of[h] == pa) & into_a.ok & into_b.ok
        values.append(np.where(ok, np.maximum(load_a + into_a.delta, load_b + into_b.delta), _NONE))
        partners.append(h)

    kind = np.argmin(values, axis=0)  # ties: the move, then the first partner
    best = np.min(values, axis=0)
    cand = np.flatnonzero(best < load_a)  # strictly lowers the pair's maximum
    if cand.size == 0:
        return 0
    win = cand[first_min_per_pair(pa[cand], best[cand])]  # ties: the lower group
    # Applied as priced above, all at once: each pair changes its own ranks' groups, and
    # every destination is read from the sweep's start (pc, roomy).
    moved, swapped = win[kind[win] == 0], win[kind[win] > 0]
    sm = _slots(pc, a[moved])
    sent, to = [sm.pieces], [roomy[b_ranks[pa[moved]][sm.group], sm.place]]
    changed = [a[moved]]
    if swapped.size:
        g, h = a[swapped], np.stack(partners)[kind[swapped] - 1, swapped]
        sg, sh = _slots(pc, g), _slots(pc, h)
        sent += [sh.pieces, sg.pieces]
        to += [pc.bin[sg.pieces[sh.swapped_in(sg)]],
               pc.bin[sh.pieces[sg.swapped_in(sh)]]]
        changed += [g, h]
    _send(st, pc, np.concatenate(sent), np.concatenate(to))
    pc.cut(st, np.unique(np.concatenate(changed)))
    return int(win.size)


def _send(st: BinState, pc: _Pieces, pieces: np.ndarray, to: np.ndarray) -> None:
    """Put each piece's samples into micro-batch ``to``, and book it."""
    seg, j = segments(pc.count[pieces])
    st.bin_of[pc.samples[pc.piece_start[pieces][seg] + j]] = to[seg]
    st.shift(pc.bin[pieces], to, pc.tokens[pieces], pc.count[pieces], pc.part[pieces])
