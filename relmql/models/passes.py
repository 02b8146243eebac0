"""The transformers backend's forward passes: a batch of sequences read as one sequence under a
tree attention mask, or as padded rows, in pieces where they are long, replayed as CUDA graphs
where they fit one (docs/models.md, *Inside the model backend*)."""

from __future__ import annotations

import inspect
import time
import weakref
from typing import TYPE_CHECKING, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch

from .attention import Stage, cache_tensors, full_cache, mask_kinds, preloaded_cache, wrote_in_place
from .base import ModelState
from .graphs import PADDED, TREE, Graphs
from .kvpool import PAD
from .kvstore import KVBlock, Lost
from .threads import threads_for

if TYPE_CHECKING:
    from .hf import TransformersModel

LOGITS_BYTES = 256 * 2 ** 20  # float32 logits of one forward pass, at most (unless one sequence needs more)
PIECE_TOKENS = 512  # new tokens of one sequence per forward pass, at most (fewer where their logits pass LOGITS_BYTES)
TREE_SHARING = 4  # tree attention while a batch's ancestors take at most this many times its longest one


class Seq(NamedTuple):
    """One sequence of a batch: what a forward pass reads for it."""

    past: Tuple[int, ...]  # the tokens read before the new ones (with ``chain``), () from the start
    chain: Optional[List[KVBlock]]  # the blocks holding the past's keys and values, oldest first; None: none
    new: List[int]  # the tokens the pass reads
    known: int  # how many tokens at the start of ``new`` are not the caller's (the start token, an evicted past)


class ForwardPasses:
    """The forward passes of one ``TransformersModel`` (``lm``: its module, device, dtype,
    vocabulary, stats and ``KVStore``). ``forward`` reads a batch of ``Seq``s in as few passes
    as the logits cap allows, ``reread`` computes evicted blocks' keys and values again. How they
    read (set by the probes when the model is loaded): ``tree_attention``, ``preload`` (past keys
    laid out with room for the new ones) and ``graphs`` (CUDA graphs, or None)."""

    def __init__(self, lm: "TransformersModel"):
        module = lm.model
        self.lm = weakref.proxy(lm)  # the model these passes serve (it owns them)
        self.cache_arg = cache_argument(module)  # the name of the cache argument of the module's forward
        self.keep_arg = "logits_to_keep" in inspect.signature(module.forward).parameters  # logits of the last only
        self.mask_kinds = mask_kinds(module.config)  # (mask name, sliding window) per kind of layer
        self.stage = Stage()  # the buffer into which each call's pasts are gathered
        self.preload = True  # a call's past keys and values are laid out with room for its new ones
        self.tree_attention = False  # batches as one sequence under a tree mask (else padded rows)
        self.graphs: Optional[Graphs] = None  # padded passes replayed as CUDA graphs (on a GPU)

    @property
    def nbytes(self) -> int:
        """Bytes of the passes' own buffers (the staging buffer and the graphed passes')."""
        return self.stage.nbytes + (self.graphs.nbytes if self.graphs is not None else 0)

    def trim(self, budget: int) -> None:
        """Keep the buffers within half of a key/value ``budget`` (made smaller since they grew)."""
        if self.stage.nbytes > budget // 2:
            self.stage.clear()  # a budget too small to keep it: laid out afresh each call
        if self.graphs is not None:
            self.graphs.shrink(budget // 2)

    @property
    def kv_shape(self) -> tuple:
        """``(2 * layers, kv_heads, head_dim)`` of the pool's keys and values (the graphs' shapes)."""
        d = self.lm.store.pool.data
        return d.shape[0], d.shape[1], d.shape[3]

    def piece(self) -> int:
        """The most new tokens of one sequence a forward pass reads (their logits within LOGITS_BYTES)."""
        return max(1, min(PIECE_TOKENS, LOGITS_BYTES // (4 * len(self.lm.vocabulary))))

    def restore_piece(self) -> int:
        """The most tokens one pass reads again (all positions' logits count where the module
        cannot keep only the last's)."""
        return PIECE_TOKENS if self.keep_arg else self.piece()

    def forward(self, seqs: Sequence[Seq]) -> List[ModelState]:
        """The batch's new states. A batch whose logits would take more than LOGITS_BYTES runs in
        several passes, and a sequence of more than a piece of new tokens a piece at a time."""
        piece = self.piece()
        out, group, size = [], [], 0
        for seq in seqs:
            b = len(seq.new) * len(self.lm.vocabulary) * 4
            if group and (size + b > LOGITS_BYTES or len(seq.new) > piece):
                out += self._batch(group)
                group, size = [], 0
            if len(seq.new) > piece:
                out.append(self._pieces(seq, piece))
                continue
            group.append(seq)
            size += b
        if group:
            out += self._batch(group)
        return out

    def _pieces(self, seq: Seq, piece: int) -> ModelState:
        """One sequence with many new tokens (a long prompt), ``piece`` of them per pass, each
        over the keys and values of the ones before; the state is the last pass's, with every
        new token's log-probability."""
        lps = np.full(len(seq.new), np.nan)
        past, chain, state = seq.past, seq.chain, None
        for a in range(0, len(seq.new), piece):
            part = seq.new[a:a + piece]
            got, = self._batch([Seq(past, chain, part, 0)])
            if state is not None:  # the first token of a piece, from the pass before it
                lps[a] = float(state.logprobs[part[0]])
            lps[a + 1:a + len(part)] = got.token_logprobs[1:]
            past, chain, state = got.tokens, got.cache.chain(), got
        return ModelState(state.tokens, state.logprobs, lps[seq.known:], state.cache)

    def _batch(self, seqs: Sequence[Seq]) -> List[ModelState]:
        if self.tree_attention:
            union, where, sizes = [], {}, []
            for seq in seqs:
                for blk in seq.chain or ():
                    if id(blk) not in where:
                        where[id(blk)] = len(union)
                        union.append(blk)
                sizes.append(sum(b.n for b in seq.chain) if seq.chain else 0)
            # one sequence of the batch's new tokens over its ancestors' keys and values, each
            # once; where the sequences share little (independent samples), padded copies cost less
            if sum(b.n for b in union) <= TREE_SHARING * max(sizes, default=0) + 64:
                return self._tree(seqs, union, where)
        return self._padded(seqs)

    def _tree(self, seqs: Sequence[Seq], union: List[KVBlock], where: Dict[int, int]) -> List[ModelState]:
        """The batch as one sequence (tree attention): the new tokens of every element, one after
        another, over the keys and values of their ancestors, each block of them once."""
        parts = [([where[id(b)] for b in seq.chain or ()], ()) for seq in seqs]
        fresh, logprobs, ids = self.tree_pass([seq.new for seq in seqs],
                                              [seq.chain[-1].length if seq.chain else 0 for seq in seqs], union, parts)
        dev = self.lm.device
        starts = np.cumsum([0] + [len(seq.new) for seq in seqs])
        T = int(starts[-1])
        nxt = torch.zeros(T, dtype=torch.long, device=dev)
        nxt[:-1] = ids[1:].to(dev)
        within = torch.gather(logprobs, 1, nxt.unsqueeze(-1)).squeeze(-1).double().cpu().numpy()  # (T,)
        nexts = logprobs[torch.from_numpy(starts[1:] - 1).to(dev)]  # (batch, vocab)
        slots = self.lm.store.keep(fresh)
        spans = list(zip(starts[:-1].tolist(), starts[1:].tolist()))
        return self._states(seqs, [slots[r0:r1] for r0, r1 in spans], [within[r0:r1] for r0, r1 in spans], nexts)

    def reread(self, group: List[Lost]) -> torch.Tensor:
        """The keys and values of ``group``'s evicted blocks, (2 * layers, kv_heads, their tokens,
        head_dim), read again in one pass over their kept ancestors (``reread_layout``)."""
        union, parts = reread_layout(group)
        return self.tree_pass([list(t) for _, t in group], [b.length - b.n for b, _ in group], union, parts,
                              logits=False)[0]

    def tree_pass(self, news, bases, union: List[KVBlock], parts, logits: bool = True):
        """One forward pass of elements' new tokens (``news[e]``, at positions from ``bases[e]``),
        one after another, over ``union``'s blocks of keys and values, each once, under the mask
        of ``tree_layout`` (``parts``). Returns the new tokens' keys and values (2 * layers,
        kv_heads, T, head_dim), their log-probabilities (T, vocab) (None without ``logits``) and
        the token ids (T,)."""
        ids, depth, allowed = tree_layout(news, bases, union, parts)
        T, U = len(ids), len(depth) - len(ids)
        graphed = self.graphed(TREE, T, U, 1) if logits else None
        at = U  # where the new tokens' keys start
        if graphed is not None:  # padded to the graph's shape
            allowed, depth = widen_tree(allowed, depth, U, graphed.rows, graphed.past)
            at = graphed.past
        pos = torch.from_numpy(depth[at:]).unsqueeze(0)  # (1, rows)
        mask = self._tree_masks(allowed, depth, at, graphed)
        if graphed is None:
            cache, buf = self._tree_cache(union, T, U)
            out, logprobs = self._run(ids.unsqueeze(0), mask, pos, cache, T, logits)
        else:
            # straight into the graph's buffer, its padding and the new tokens' room read as zeros
            slots = self.lm.store.take(union)
            self.lm.store.pool.read(np.concatenate(slots + [np.full(graphed.kv.shape[2] - U, PAD)]), out=graphed.kv)
            graphed.ids[0, :T].copy_(ids)
            graphed.pos.copy_(pos)
            out, logprobs = self._run(None, None, None, None, T, run=graphed)
            buf = graphed.kv
        # (2 * layers, kv_heads, T, head_dim): where the model wrote them, or copied out layer by layer
        if buf is not None and wrote_in_place(out[self.cache_arg]):
            fresh = buf[:, :, at:at + T]
        else:
            layers = cache_tensors(out[self.cache_arg])
            fresh = torch.stack([t[0, :, at:at + T] for k, v in layers for t in (k, v)], 0)
        return fresh, (logprobs[0, :T] if logits else None), ids

    def _tree_masks(self, allowed: np.ndarray, depth: np.ndarray, at: int, graphed):
        """The additive 4D masks (1, 1, rows, at + rows) of ``allowed`` (rows, at + rows), one per
        kind of layer (a sliding window's keeps only the keys within it): one tensor, or a dict
        by kind; in the graph's buffers where ``graphed``."""
        dtype, masks = self.lm.dtype, {}
        for kind, window in self.mask_kinds:
            ok = allowed if window is None else allowed & (depth[at:, None] - depth[None, :] < window)
            m = torch.zeros((1, 1) + ok.shape, dtype=dtype)
            m.masked_fill_(torch.from_numpy(~ok), torch.finfo(dtype).min)
            masks[kind] = m.to(self.lm.device) if graphed is None else graphed.masks[kind].copy_(m)
        return masks[None] if None in masks else masks

    def _tree_cache(self, union: List[KVBlock], T: int, U: int):
        """The cache of an eager tree pass: ``union``'s keys and values one after another in the
        staging buffer (2 * layers, kv_heads, >= U + T, head_dim), with room for the new tokens'
        (which the buffer is also returned for); an empty cache without ancestors."""
        if not U:
            return full_cache(), None
        self.lm.store.take(union)
        buf = self.stage.lay_out(union, T, self.lm.store.pool)
        return self._preloaded([(buf[2 * i, :, :U + T].unsqueeze(0), buf[2 * i + 1, :, :U + T].unsqueeze(0))
                                for i in range(buf.shape[0] // 2)], U), buf

    def _padded(self, seqs: Sequence[Seq]) -> List[ModelState]:
        """The batch as padded sequences: each one's past keys and values gathered from the pool,
        left-padded (on a GPU, into the buffers of a captured pass of the next larger shape,
        ``graphs.Pass``)."""
        dev = self.lm.device
        chains = [seq.chain for seq in seqs]
        past_len = np.array([len(seq.past) if seq.chain is not None else 0 for seq in seqs], np.int64)
        new_len = np.array([len(seq.new) for seq in seqs], np.int64)
        B, P, N = len(seqs), int(past_len.max()), int(new_len.max())
        graphed = self.graphed(PADDED, B, P, N)
        rows, P = (graphed.rows, graphed.past) if graphed is not None else (B, P)
        ids, mask, pos, mine = padded_layout(seqs, past_len, new_len, rows, P, N)
        if graphed is not None:
            graphed.ids.copy_(ids)
            graphed.mask.copy_(mask)
            graphed.pos.copy_(pos)
            self._batch_cache(chains, past_len, P, N, into=graphed)
            out, logprobs = self._run(None, None, None, None, int(new_len.sum()), run=graphed)
            buf = graphed.kv
        else:
            cache, buf = self._batch_cache(chains, past_len, P, N) if P else (full_cache(), None)
            out, logprobs = self._run(ids, mask.to(dev), pos, cache, int(new_len.sum()))
        logprobs = logprobs[:B]  # (B, N, vocab)
        # log-probability of each new token given the ones before it
        nxt = torch.zeros((B, N), dtype=torch.long, device=dev)
        nxt[:, :-1] = ids[:B, 1:].to(dev)
        within = torch.gather(logprobs, 2, nxt.unsqueeze(-1)).squeeze(-1).double().cpu().numpy()  # (B, N)
        nexts = logprobs[torch.arange(B, device=dev), torch.from_numpy(new_len - 1).to(dev)]  # (B, vocab)
        slots = self.lm.store.keep(padded_fresh(out[self.cache_arg], buf, rows, P, N, mine[:B], dev))
        ends = np.cumsum(new_len)
        return self._states(seqs, [slots[e - n:e] for e, n in zip(ends.tolist(), new_len.tolist())], list(within),
                            nexts)

    def _batch_cache(self, chains, past_len: np.ndarray, P: int, N: int, into=None):
        """The batch's past keys and values, left-padded to ``P``, each followed by room for
        ``N`` new tokens, gathered from the pool at once into the staging buffer: the cache over
        it and the buffer, (2 * layers, kv_heads, batch * (P + N), head_dim) (``into``: a
        ``graphs.Pass`` whose buffer takes them instead, its rows beyond the batch's zeros; then
        nothing is returned)."""
        store = self.lm.store
        pad = np.full(P + N, PAD, np.int64)
        pieces = []
        for chain, n in zip(chains, past_len.tolist()):
            if P - n:
                pieces.append(pad[:P - n])
            pieces += store.take(chain or ())
            pieces.append(pad[:N])
        if into is not None:
            pieces += [pad] * (into.rows - len(chains))
            store.pool.read(np.concatenate(pieces), out=into.kv)
            return None
        flat = self.stage.gather(np.concatenate(pieces), store.pool)
        full = flat.view(flat.shape[0], flat.shape[1], len(chains), P + N, flat.shape[3])
        return self._preloaded([(full[2 * i].transpose(0, 1), full[2 * i + 1].transpose(0, 1))
                                for i in range(full.shape[0] // 2)], P), flat

    def _preloaded(self, layers, filled: int):
        """The cache of a call whose past keys and values fill the first ``filled`` positions of
        ``layers``' buffers (or, where the probe found the model does not write where asked, a
        plain cache of copies of them)."""
        if self.preload:
            return preloaded_cache(layers, filled)
        return full_cache([(k[:, :, :filled], v[:, :, :filled]) for k, v in layers])

    def graphed(self, kind: str, rows: int, past: int, new: int):
        """The CUDA-graph pass for a call of this shape (``graphs.Graphs.get``), or None."""
        if self.graphs is None or not past or self.lm.store.pool.data is None:
            return None
        return self.graphs.get(kind, rows, past, new, LOGITS_BYTES)

    def _run(self, ids, mask, pos, cache, ntokens: int, logits: bool = True, run=None):
        """One forward pass, timed and counted: its output and float32 log-probabilities
        (rows, new tokens, vocab) (as transformers scores; its rounding moves a log-probability by
        up to 3e-5), or only its keys and values (``logits`` False: the log-probabilities are
        None). ``ids`` and ``pos`` (rows, new tokens); ``run``: a ``graphs.Pass`` whose buffers
        hold the call (the other inputs are then None)."""
        lm = self.lm
        dev = lm.device
        t0 = time.perf_counter()
        keep = {} if logits or not self.keep_arg else {"logits_to_keep": 1}
        with threads_for(dev, ntokens):
            if run is not None:
                out = run.run()
            else:
                out = lm.model(input_ids=ids.to(dev), attention_mask=mask, position_ids=pos.to(dev),
                               use_cache=True, **{self.cache_arg: cache}, **keep)
            logprobs = torch.log_softmax(out.logits.float(), dim=-1) if logits else None
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        lm.stats.seconds += time.perf_counter() - t0
        lm.stats.calls += 1
        lm.stats.tokens += ntokens
        return out, logprobs

    def _states(self, seqs: Sequence[Seq], slots, within, nexts) -> List[ModelState]:
        """The batch's new states: each element's block of new keys and values (at ``slots[e]``
        of the pool), the log-probabilities of its new tokens from ``within[e]`` (that of each
        token at the position before it) and its next-token distribution ``nexts[e]`` (vocab,)."""
        states = []
        for e, seq in enumerate(seqs):
            parent = seq.chain[-1] if seq.chain else None
            n = len(seq.new)
            block = KVBlock(parent, slots[e], n, (parent.length if parent else 0) + n)
            self.lm.store.add(block)
            # the first caller token's probability needs the position before it
            w = within[e]
            tok_lp = w[seq.known - 1:n - 1] if seq.known else np.concatenate([[np.nan], w[:n - 1]])
            states.append(ModelState(tuple(seq.past) + tuple(seq.new), nexts[e], tok_lp, block))
        return states


def tree_layout(news, bases, union: List[KVBlock], parts):
    """The inputs of a tree pass: the new tokens' ids (T,), the position of each key, the
    union's blocks' then the new tokens' (U + T,), and which keys each new token sees (T, U + T):
    the union blocks ``parts[e][0]``, all tokens of the elements ``parts[e][1]`` of this pass, and
    its own element's tokens up to itself."""
    offsets = np.cumsum([0] + [b.n for b in union])
    U = int(offsets[-1])
    starts = np.cumsum([0] + [len(n) for n in news])
    T = int(starts[-1])
    ids = torch.tensor([t for n in news for t in n], dtype=torch.long)
    sizes, ns = np.diff(starts), np.array([b.n for b in union], np.int64)
    depth = np.concatenate([np.repeat(np.array([b.length for b in union], np.int64) - ns - offsets[:-1], ns)
                            + np.arange(U), np.repeat(np.asarray(bases, np.int64) - starts[:-1], sizes)
                            + np.arange(T)])
    # which union blocks each element sees, spread to their tokens; its own tokens up to each one
    sees = np.zeros((len(parts), len(union)), bool)
    sees[np.repeat(np.arange(len(parts)), [len(b) for b, _ in parts]),
         np.fromiter((k for b, _ in parts for k in b), np.int64)] = True
    allowed = np.zeros((T, U + T), bool)
    allowed[:, :U] = np.repeat(np.repeat(sees, sizes, 0), ns, 1)
    own = np.repeat(np.arange(len(parts)), sizes)
    allowed[:, U:] = (own[:, None] == own[None, :]) & np.tri(T, dtype=bool)
    for e, (_, among) in enumerate(parts):
        for f in among:
            allowed[starts[e]:starts[e + 1], U + starts[f]:U + starts[f + 1]] = True
    return ids, depth, allowed


def reread_layout(group: List[Lost]) -> Tuple[List[KVBlock], list]:
    """The ancestors kept in the pool of a group of evicted blocks (ancestors first), each once,
    and each block's ``parts`` for ``tree_layout``: the kept ancestors it sees, and the blocks of
    the group below which it lies (their tokens are read in the same pass)."""
    inside = {id(b): e for e, (b, _) in enumerate(group)}
    union, where, parts = [], {}, []
    for blk, _ in group:
        kept, among = [], []
        a = blk.parent
        while a is not None:
            if id(a) in inside:
                among.append(inside[id(a)])
            else:
                kept.append(a)
            a = a.parent
        for a in reversed(kept):
            if id(a) not in where:
                where[id(a)] = len(union)
                union.append(a)
        parts.append(([where[id(a)] for a in kept], among))
    return union, parts


def widen_tree(allowed: np.ndarray, depth: np.ndarray, U: int, Tb: int, Ub: int) -> Tuple[np.ndarray, np.ndarray]:
    """A tree pass's mask (T, U + T) and key positions (U + T,) padded to a graph's shape (Tb new
    tokens over Ub keys): its extra keys and rows see nothing else, each row itself."""
    T = allowed.shape[0]
    wide = np.zeros((Tb, Ub + Tb), bool)
    wide[:T, :U], wide[:T, Ub:Ub + T] = allowed[:, :U], allowed[:, U:]
    wide[np.arange(T, Tb), Ub + np.arange(T, Tb)] = True
    deep = np.zeros(Ub + Tb, np.int64)
    deep[:U], deep[Ub:Ub + T] = depth[:U], depth[U:]
    return wide, deep


def padded_layout(seqs: Sequence[Seq], past_len: np.ndarray, new_len: np.ndarray, rows: int, P: int, N: int):
    """The inputs of a padded pass: each row its past at the right of ``P`` positions, then its
    new tokens, padding after them (rows that only pad the batch to its graph's shape see their
    own positions). Returns the ids (rows, N), the 0/1 mask (rows, P + N), the positions (rows, N)
    and which places hold a new token (rows, N)."""
    B = len(seqs)
    past_all = np.zeros(rows, np.int64)
    past_all[:B] = past_len
    new_all = np.full(rows, N, np.int64)
    new_all[:B] = new_len
    col = np.arange(P + N)
    mask = torch.from_numpy(((col >= P - past_all[:, None]) & (col < P + new_all[:, None])).astype(np.int64))
    mine = col[None, :N] < new_all[:, None]
    mine[B:] = False
    pos = torch.from_numpy(np.where(mine, past_all[:, None] + col[:N], 0))
    flat = np.zeros((rows, N), np.int64)
    flat[mine] = np.fromiter((t for seq in seqs for t in seq.new), np.int64, int(new_len.sum()))
    return torch.from_numpy(flat), mask, pos, mine


def padded_fresh(cache, buf, rows: int, P: int, N: int, mine: np.ndarray, device) -> torch.Tensor:
    """A padded pass's new keys and values, row after row, (2 * layers, kv_heads, new tokens,
    head_dim): read where the model wrote them, in the buffer the call's pasts were gathered
    into (``buf``), or copied out of its ``cache``; ``mine`` (B, N): which places hold a token."""
    B = mine.shape[0]
    if buf is not None and wrote_in_place(cache):
        fresh = buf.view(buf.shape[0], buf.shape[1], rows, P + N, buf.shape[-1])[:, :, :B, P:]
    else:
        fresh = torch.stack([t[:B, :, P:].transpose(0, 1) for k, v in cache_tensors(cache) for t in (k, v)], 0)
    fresh = fresh.reshape(fresh.shape[0], fresh.shape[1], B * N, fresh.shape[-1])
    if not mine.all():
        fresh = fresh.index_select(2, torch.from_numpy(np.flatnonzero(mine)).to(device))
    return fresh


def cache_argument(model) -> str:
    """The name under which this transformers version passes and returns a model's key/value
    cache: ``cache`` (newer 5.x releases, which warn about the old name) or ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
