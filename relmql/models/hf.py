"""The transformers backend: ``TransformersModel``, a ``LanguageModel`` backed by a transformers causal
LM, loaded from a local folder or a Hugging Face hub id (the built-in models' loaders build one too)."""

from __future__ import annotations

import contextlib
import inspect
import os
import threading
import time
import weakref
from collections import OrderedDict
from typing import List, Optional, Sequence

import numpy as np
import torch

from ..errors import ModelError
from ..memory import return_large_blocks
from .attention import ATTENTION_NAME, Stage, preloaded_cache, use_grouped_attention, wrote_in_place
from .base import LanguageModel, ModelState, ModelStats
from .device import approximate, resolve_device, resolve_dtype
from .graphs import PADDED, TREE, Graphs
from .kvpool import PAD, KVPool
from .threads import threads_for
from .vocab import Vocabulary, from_tokenizer

DEFAULT_KV_BUDGET = 2 ** 30  # bytes of cached keys and values kept per model (a query sets its own share)
LOGITS_BYTES = 256 * 2 ** 20  # float32 logits of one forward pass, at most (unless one sequence needs more)
PIECE_TOKENS = 512  # new tokens of one sequence per forward pass, at most (fewer where their logits pass LOGITS_BYTES)
PROBE_TOLERANCE = 1e-3  # the most a checked way of reading may differ from transformers' own, at load
TREE_SHARING = 4  # tree attention while a batch's ancestors take at most this many times its longest one


class KVBlock:
    """The keys and values of a run of ``n`` tokens (ending at position ``length``), chained to
    the block before it: ``slots``, their places in the model's ``KVPool``, or None once
    evicted. A state's cache is its last block; sequences that share a beginning share its
    blocks, so a child node stores only its own token. ``cell`` holds the slots, for the weak
    reference that gives them back when the block is dropped (the pool may move them)."""

    __slots__ = ("parent", "n", "length", "cell", "__weakref__")

    def __init__(self, parent: Optional["KVBlock"], slots: Optional[np.ndarray], n: int, length: int):
        self.parent, self.n, self.length, self.cell = parent, n, length, [slots]

    @property
    def slots(self) -> Optional[np.ndarray]:
        return self.cell[0]

    @slots.setter
    def slots(self, value: Optional[np.ndarray]) -> None:
        self.cell[0] = value

    def chain(self) -> List["KVBlock"]:
        out, b = [], self
        while b is not None:
            out.append(b)
            b = b.parent
        out.reverse()
        return out


class TransformersModel(LanguageModel):
    """Any transformers causal LM with a fast tokenizer.

    ``extend`` reads a batch of sequences in one forward pass: their new tokens as one sequence
    under a tree attention mask, or (where the model cannot take one) padded (past on the left,
    new tokens on the right). Keys and values live in a tree of ``KVBlock``s; when they take
    more than ``kv_budget`` bytes, the least recently used blocks are dropped, and a call that
    needs dropped blocks reads each of them again once, in place (without tree attention, a
    sequence that needs one is read again from the start).
    """

    def __init__(self, model, tokenizer, name: str, bos_id: Optional[int] = None, eos_id: Optional[int] = None,
                 kv_budget: int = DEFAULT_KV_BUDGET):
        return_large_blocks()
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.approximate = approximate(str(self.dtype).replace("torch.", ""), str(self.device))
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.max_length = getattr(config, "max_position_embeddings", None)
        vocab_size = model.get_output_embeddings().weight.shape[0]
        self.vocabulary: Vocabulary = from_tokenizer(tokenizer, vocab_size, eos_id=eos_id, bos_id=bos_id)
        if self.vocabulary.bos_id is None:
            raise ModelError(f"model {name!r} has neither a start-of-text nor an end-of-text token")
        self.stats = ModelStats()
        self._cache_arg = cache_argument(model)
        self._keep_arg = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.kv_budget = kv_budget
        self.pool = KVPool()
        self._kv_lru: "OrderedDict[int, weakref.ref]" = OrderedDict()
        self._mask_kinds = _mask_kinds(model.config)
        self.grouped_attention = use_grouped_attention(self.model)
        self._stage = Stage()
        self._lock = threading.RLock()
        self.preload = True  # a call's past keys and values are laid out with room for its new ones
        self.tree_attention = False
        self.graphs: Optional[Graphs] = None  # padded passes replayed as CUDA graphs (on a GPU)
        self.attention = "padded copies of each sequence's keys and values"
        self._probe_tree_attention()
        if self.device.type == "cuda":
            self._probe_graphs()

    @classmethod
    def from_pretrained(cls, path: str, device: Optional[str] = None, dtype: Optional[str] = None,
                        name: Optional[str] = None, **kwargs) -> "TransformersModel":
        """Load a model from a local directory or (where the user has network or a cache) the hub."""
        from transformers import AutoModelForCausalLM, AutoTokenizer
        dev = resolve_device(device)
        dt = resolve_dtype(dtype, dev)
        local = os.path.isdir(path)
        if local:
            missing = missing_model_files(path)
            if missing:
                listed = ", no ".join(missing[:-1]) + (" and no " if len(missing) > 1 else "") + missing[-1]
                raise ModelError(f"could not load model {path!r}: the folder has no {listed}",
                                 hint="a model folder is what transformers' save_pretrained writes "
                                      "(model and tokenizer)")
        elif not _hub_reachable():
            kwargs.setdefault("local_files_only", True)  # no network: only the local cache
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dt, **kwargs)
        except (OSError, ValueError, KeyError) as e:
            why = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
            if local:
                raise ModelError(f"could not load model {path!r}: transformers cannot read the folder "
                                 f"({why})") from None
            raise ModelError(f"could not load model {path!r}: it is neither a local folder nor a model in the Hugging "
                             f"Face cache ({why})", hint="downloading from the hub needs network access") from None
        return cls(model.to(dev), tokenizer, name or path)

    def _probe_tree(self):
        """The small tree the load-time checks read: a root's tokens, then the new tokens of its
        two children and of a new root."""
        return [self.eos_id, self.bos_id], [[self.bos_id], [self.eos_id, self.bos_id], [self.eos_id]]

    def _probe_tree_attention(self) -> None:
        """Check, on a small tree, each way this backend departs from transformers' own cached
        forward pass (padded copies, transformers' attention): the grouped-query attention
        function, keys and values laid out ahead of the call, and tree attention (twice, the
        second call reusing the staged beginning), where the model takes a custom 4D mask. Each
        must give the same log-probabilities, else it is switched off and EXPLAIN says why."""
        kind = type(self.model).__name__
        start, new = self._probe_tree()
        notes = []
        try:
            self.tree_attention = False
            self.preload = False
            with self._original_attention():
                root = self.extend([None], [start])[0]
                parents = [root, root, None]
                reference = self.extend(parents, new)
            if self.grouped_attention and not _agrees(reference, lambda: self.extend(parents, new)):
                self.model.set_attn_implementation("sdpa")
                self.grouped_attention = False
                notes.append(f"{kind} gave other numbers with shared key/value heads")
            self.preload = True
            if not _agrees(reference, lambda: self.extend(parents, new)):
                self.preload = False
                notes.append(f"keys and values copied once more by the cache: {kind} did not write new keys where "
                             f"laid out")
            self.tree_attention = True
            worst = _worst(reference, self.extend(parents, new))
            worst = max(worst, _worst(reference, self.extend(parents, new)))  # the staged beginning kept
        except Exception as e:  # a model family that cannot take the mask
            self.tree_attention = False
            self.attention = (f"padded copies of each sequence's keys and values ({kind} did not take a tree "
                              f"attention mask: {type(e).__name__})")
            worst = None
        finally:
            self.stats = ModelStats()
            self._stage.clear()
        if worst is not None and worst > PROBE_TOLERANCE:
            self.tree_attention = False
            self.attention = (f"padded copies of each sequence's keys and values ({kind} gave other numbers under a "
                              f"tree attention mask: {worst:.1e})")
        elif worst is not None:
            self.attention = ("tree attention: keys and values in one pool, from which each call gathers its nodes' "
                              "ancestors' once, a shared beginning kept in place from call to call")
        if self.grouped_attention:
            notes.append("grouped-query heads share their keys and values")
        self.attention += "".join(f"; {n}" for n in notes)

    def _probe_graphs(self, capture: bool = True) -> None:
        """Check that passes replayed as CUDA graphs (``capture`` False: the same padded shapes
        run eagerly) give the eager passes' log-probabilities, padded and (where the model takes
        it) under tree attention, and keys and values from which the next pass reads the same;
        if so they are used from then on, else EXPLAIN says why not."""
        start, new = self._probe_tree()
        tree = self.tree_attention
        why, graphs, ok = None, Graphs(self, capture), False
        try:
            root = self.extend([None], [start])[0]
            parents = [root, root, None]
            for self.tree_attention in sorted({False, tree}):
                self.graphs = None
                reference = self.extend(parents, new)
                after = self.extend(reference, [[self.bos_id]] * 3)
                for _ in range(2):  # a shape is captured when it is met again
                    self.graphs = graphs
                    got = self.extend(parents, new)
                    self.graphs = None  # the keys and values the graph wrote, read by an eager pass
                    if _worst(reference, got) > PROBE_TOLERANCE or not _agrees(
                            after, lambda: self.extend(got, [[self.bos_id]] * 3)):
                        why = "they gave other numbers"
            ok = why is None and {k[0] for k in graphs.passes} == ({PADDED, TREE} if tree else {PADDED})
        except Exception as e:  # the model's code could not be captured
            why = f"{type(e).__name__}"
        finally:
            self.tree_attention = tree
            self.graphs = graphs if ok else None
            self.stats = ModelStats()
            self._stage.clear()
        if ok:
            self.attention += ("; forward passes replayed as CUDA graphs" if capture else
                               "; forward passes in the shapes of CUDA graphs, run eagerly")
        else:
            why = why or graphs.failure or "no shape fits"
            self.attention += f"; forward passes run eagerly (CUDA graphs: {why})"

    @contextlib.contextmanager
    def _original_attention(self):
        """A context in which the model attends as transformers has it (not ``relmql_sdpa``)."""
        if not self.grouped_attention:
            yield
            return
        self.model.set_attn_implementation("sdpa")
        try:
            yield
        finally:
            self.model.set_attn_implementation(ATTENTION_NAME)

    # -- the key/value store
    def _register(self, block: KVBlock):
        key = id(block)
        self._kv_lru[key] = weakref.ref(block, lambda _, k=key, cell=block.cell: self._forget(k, cell))

    def _forget(self, key: int, cell: list):
        if self._kv_lru.pop(key, None) is not None and cell[0] is not None:
            self.pool.give_back(cell[0])
            cell[0] = None

    def _touch(self, block: KVBlock):
        if id(block) in self._kv_lru:
            self._kv_lru.move_to_end(id(block))

    def _room(self) -> int:
        """Bytes of the budget left to the pool (the staging buffer and the graphs take theirs)."""
        return self.kv_budget - self._stage.nbytes - (self.graphs.nbytes if self.graphs is not None else 0)

    def _evict(self):
        if self._stage.nbytes > self.kv_budget // 2:
            self._stage.clear()  # a budget too small to keep it: laid out afresh each call
        if self.graphs is not None:
            self.graphs.shrink(self.kv_budget // 2)  # a budget made smaller since they were captured
        pool, room = self.pool, self._room()
        size = pool.slot_bytes
        while (pool.used + 1) * size > room and self._kv_lru:  # (+ 1: the padding's slot)
            key, ref = self._kv_lru.popitem(last=False)
            block = ref()
            if block is not None and block.slots is not None:
                pool.give_back(block.slots)
                block.slots = None
        if pool.nbytes > max(room, 0):  # grown past its room by one call, or a smaller budget: packed
            live = [b for b in (r() for r in self._kv_lru.values()) if b is not None and b.slots is not None]
            live.sort(key=lambda b: b.length)
            pool.resize(max(room // size, 1), live)

    def set_cache_budget(self, nbytes: int) -> None:
        self.kv_budget = nbytes
        self._evict()

    @property
    def kv_bytes(self) -> int:
        """Bytes of keys and values held now (the pool, the staging buffer and the graphed passes'
        buffers)."""
        return self.pool.nbytes + self._stage.nbytes + (self.graphs.nbytes if self.graphs is not None else 0)

    # -- reading tokens
    @torch.inference_mode()
    def extend(self, states: Sequence[Optional[ModelState]], tokens: Sequence[Sequence[int]]) -> List[ModelState]:
        with self._lock:  # one call at a time: the staging buffer and the block records are shared
            return self._extend(states, tokens)

    @torch.inference_mode()
    def begin(self, ids: Sequence[int]) -> ModelState:
        ids = [int(t) for t in ids]
        if not ids:
            raise ValueError("begin needs at least one token")
        if self.max_length is not None and len(ids) > self.max_length:
            raise self.context_error(len(ids), " for the prompt", hint="shorten PROMPT")
        with self._lock:
            return self._forward([((), None, ids, 1)])[0]

    def _extend(self, states, tokens) -> List[ModelState]:
        if len(states) != len(tokens):
            raise ValueError("states and tokens differ in length")
        seqs, lost = [], {}
        for st, new in zip(states, tokens):
            new = [int(t) for t in new]
            if st is None:
                seqs.append(((), None, [self.bos_id] + new, 1))
                continue
            if not new:
                raise ValueError("extend needs at least one new token for an existing state")
            chain = st.cache.chain() if st.cache is not None else None
            gone = [b for b in chain if b.slots is None] if chain is not None else None
            if chain is None or (gone and not self.tree_attention):
                # evicted: read everything again (the first new token's probability is known)
                self.stats.recomputed += len(st.tokens)
                seqs.append(((), None, list(st.tokens) + new, len(st.tokens)))
                continue
            for b in gone:  # evicted blocks are read again once for the whole call, in place (_restore)
                lost.setdefault(id(b), (b, st.tokens[b.length - b.n:b.length]))
            seqs.append((st.tokens, chain, new, 0))
        longest = max((len(past) + len(new) for past, _, new, _ in seqs), default=0)
        if self.max_length is not None and longest > self.max_length:
            raise self.context_error(longest)
        if lost:
            self._restore(sorted(lost.values(), key=lambda bt: bt[0].length))
        return self._forward(seqs)

    def _restore(self, lost) -> None:
        """Read evicted blocks again and put their keys and values back in place: each block
        once, however many of the call's sequences it begins (a long PREFIX evicted under a
        small max_memory is read once per call, not once per node), in tree-attention passes of
        at most a piece of tokens (fewer where the model computes every position's logits).
        ``lost``: (block, its tokens), ancestors first."""
        room = PIECE_TOKENS if self._keep_arg else self._piece()
        group, size = [], 0
        for blk, toks in lost:
            if group and size + blk.n > room:
                self._restore_pass(group)
                group, size = [], 0
            group.append((blk, toks))
            size += blk.n
        if group:
            self._restore_pass(group)

    def _restore_pass(self, group) -> None:
        """One forward pass that reads ``group``'s blocks again over their kept ancestors, each
        block's tokens seeing those of its ancestors in the group."""
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
        fresh = self._tree_pass([list(t) for _, t in group], [b.length - b.n for b, _ in group], union, parts,
                                logits=False)[0]
        slots = self._keep(fresh)
        at = 0
        for blk, _ in group:
            blk.slots = slots[at:at + blk.n]
            self._register(blk)
            at += blk.n
        self.stats.recomputed += at

    def _forward(self, seqs) -> List[ModelState]:
        # a batch whose logits would take more than LOGITS_BYTES runs in several forward passes,
        # and a sequence of more than a piece of new tokens a piece at a time
        piece = self._piece()
        out, group, size = [], [], 0
        for seq in seqs:
            b = len(seq[2]) * len(self.vocabulary) * 4
            if group and (size + b > LOGITS_BYTES or len(seq[2]) > piece):
                out += self._forward_batch(group)
                group, size = [], 0
            if len(seq[2]) > piece:
                out.append(self._forward_pieces(seq, piece))
                continue
            group.append(seq)
            size += b
        if group:
            out += self._forward_batch(group)
        self._evict()
        return out

    def _piece(self) -> int:
        """The most new tokens of one sequence a forward pass reads (their logits within
        LOGITS_BYTES)."""
        return max(1, min(PIECE_TOKENS, LOGITS_BYTES // (4 * len(self.vocabulary))))

    def _forward_pieces(self, seq, piece: int) -> ModelState:
        """One sequence with many new tokens (a long prompt), ``piece`` of them per forward pass,
        each over the keys and values of the ones before: no pass holds the logits or attention
        scores of thousands of positions (an 8,000-token prompt on SmolLM2 took 5 GB read at
        once). The state is the last pass's, with every new token's log-probability."""
        prev, chain, new, known = seq
        lps = np.full(len(new), np.nan)
        state = None
        for a in range(0, len(new), piece):
            part = new[a:a + piece]
            got, = self._forward_batch([(prev, chain, part, 0)])
            if state is not None:  # the first token of a piece, from the pass before it
                lps[a] = float(state.logprobs[part[0]])
            lps[a + 1:a + len(part)] = got.token_logprobs[1:]
            prev, chain, state = got.tokens, got.cache.chain(), got
        return ModelState(state.tokens, state.logprobs, lps[known:], state.cache)

    def _forward_batch(self, seqs) -> List[ModelState]:
        if self.tree_attention:
            union, where, sizes = [], {}, []
            for _, chain, _, _ in seqs:
                for blk in chain or ():
                    if id(blk) not in where:
                        where[id(blk)] = len(union)
                        union.append(blk)
                sizes.append(sum(b.n for b in chain) if chain else 0)
            # one sequence of the batch's new tokens over its ancestors' keys and values, each
            # once; where the sequences share little (independent samples), padded copies cost less
            if sum(b.n for b in union) <= TREE_SHARING * max(sizes, default=0) + 64:
                return self._forward_tree(seqs, union, where)
        return self._forward_padded(seqs)

    def _forward_padded(self, seqs) -> List[ModelState]:
        """The batch as padded sequences: each one's past keys and values gathered from the pool,
        left-padded (on a GPU, into the buffers of a captured pass of the next larger shape,
        ``graphs.Pass``)."""
        dev = self.device
        chains = [c for _, c, _, _ in seqs]
        past_len = np.array([len(p) if c is not None else 0 for p, c, _, _ in seqs], np.int64)
        new_len = np.array([len(n) for _, _, n, _ in seqs], np.int64)
        B, P, N = len(seqs), int(past_len.max()), int(new_len.max())
        graphed = self._graphed(PADDED, B, P, N)
        rows, P = (graphed.rows, graphed.past) if graphed is not None else (B, P)
        # each row: its past at the right of P positions, then its new tokens, padding after them
        # (rows that only pad the batch to its graph's shape see their own positions)
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
        flat[mine] = np.fromiter((t for _, _, n, _ in seqs for t in n), np.int64, int(new_len.sum()))
        ids = torch.from_numpy(flat)
        if graphed is not None:
            graphed.ids.copy_(ids)
            graphed.mask.copy_(mask)
            graphed.pos.copy_(pos)
            self._batch_cache(chains, past_len, P, N, into=graphed)
            out, logprobs = self._run(None, None, None, None, int(new_len.sum()), run=graphed)
            buf = graphed.kv
        else:
            cache, buf = self._batch_cache(chains, past_len, P, N) if P else (_full_cache(), None)
            out, logprobs = self._run(ids, mask.to(dev), pos, cache, int(new_len.sum()))
        logprobs = logprobs[:B]
        # log-probability of each new token given the ones before it
        nxt = torch.zeros((B, N), dtype=torch.long, device=dev)
        nxt[:, :-1] = ids[:B, 1:].to(dev)
        within = torch.gather(logprobs, 2, nxt.unsqueeze(-1)).squeeze(-1).double().cpu().numpy()
        nexts = logprobs[torch.arange(B, device=dev), torch.from_numpy(new_len - 1).to(dev)]  # [B, vocab]
        # the new tokens' keys and values, row after row, into the pool: read where the model
        # wrote them, in the buffer the call's pasts were gathered into
        if buf is not None and wrote_in_place(out[self._cache_arg]):
            fresh = buf.view(buf.shape[0], buf.shape[1], rows, P + N, buf.shape[-1])[:, :, :B, P:]
        else:
            fresh = torch.stack([t[:B, :, P:].transpose(0, 1) for k, v in _cache_tensors(out[self._cache_arg])
                                 for t in (k, v)], 0)
        fresh = fresh.reshape(fresh.shape[0], fresh.shape[1], B * N, fresh.shape[-1])
        if (new_len < N).any():
            fresh = fresh.index_select(2, torch.from_numpy(np.flatnonzero(mine[:B])).to(dev))
        slots = self._keep(fresh)
        ends = np.cumsum(new_len)
        return self._states(seqs, [slots[e - n:e] for e, n in zip(ends.tolist(), new_len.tolist())], list(within),
                            nexts)

    def _keep(self, fresh: torch.Tensor) -> np.ndarray:
        """Put a pass's new keys and values (``[2 * layers, kv_heads, n, head_dim]``) in the
        pool, grown within the budget's room where it can: their slots."""
        slots = self.pool.take(fresh.shape[2], fresh, self._room())
        self.pool.write(slots, fresh)
        return slots

    def _graphed(self, kind: str, rows: int, past: int, new: int):
        """The CUDA-graph pass for a call of this shape (``graphs.Graphs.get``), or None."""
        if self.graphs is None or not past or self.pool.data is None:
            return None
        return self.graphs.get(kind, rows, past, new, LOGITS_BYTES)

    @property
    def _kv_shape(self) -> tuple:
        """``(2 * layers, kv_heads, head_dim)`` of the pool's keys and values (the graphs' shapes)."""
        d = self.pool.data
        return d.shape[0], d.shape[1], d.shape[3]

    def _run(self, ids, mask, pos, cache, ntokens: int, logits: bool = True, run=None):
        """One forward pass, timed and counted: its output and float32 log-probabilities (as
        transformers scores; its rounding moves a log-probability by up to 3e-5), or only its
        keys and values (``logits`` False: the log-probabilities are None). ``run``: a
        ``graphs.Pass`` whose buffers hold the call (the other inputs are then None)."""
        dev = self.device
        t0 = time.perf_counter()
        keep = {} if logits or not self._keep_arg else {"logits_to_keep": 1}
        with threads_for(dev, ntokens):
            if run is not None:
                out = run.run()
            else:
                out = self.model(input_ids=ids.to(dev), attention_mask=mask, position_ids=pos.to(dev),
                                 use_cache=True, **{self._cache_arg: cache}, **keep)
            logprobs = torch.log_softmax(out.logits.float(), dim=-1) if logits else None
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        self.stats.seconds += time.perf_counter() - t0
        self.stats.calls += 1
        self.stats.tokens += ntokens
        return out, logprobs

    def _states(self, seqs, slots, within, nexts) -> List[ModelState]:
        """The batch's new states: each element's block of new keys and values (at ``slots[e]``
        of the pool), the log-probabilities of its new tokens from ``within[e]`` (that of each
        token at the position before it) and its next-token distribution ``nexts[e]``."""
        states = []
        for e, (prev, chain, new, known) in enumerate(seqs):
            parent = chain[-1] if chain else None
            block = KVBlock(parent, slots[e], len(new), (parent.length if parent else 0) + len(new))
            self._register(block)
            # `known` tokens of `new` were read before the caller's (the start token, or a whole
            # evicted sequence); the first caller token's probability needs the position before it
            w = within[e]
            tok_lp = w[known - 1:len(new) - 1] if known else np.concatenate([[np.nan], w[:len(new) - 1]])
            states.append(ModelState(tuple(prev) + tuple(new), nexts[e], tok_lp, block))
        return states

    def _forward_tree(self, seqs, union: List[KVBlock], where) -> List[ModelState]:
        """The batch as one sequence (tree attention): the new tokens of every element, one after
        another, over the keys and values of their ancestors, each block of them once."""
        parts = [([where[id(b)] for b in chain or ()], ()) for _, chain, _, _ in seqs]
        fresh, logprobs, ids = self._tree_pass([n for _, _, n, _ in seqs],
                                               [chain[-1].length if chain else 0 for _, chain, _, _ in seqs],
                                               union, parts)
        dev = self.device
        starts = np.cumsum([0] + [len(n) for _, _, n, _ in seqs])
        T = int(starts[-1])
        nxt = torch.zeros(T, dtype=torch.long, device=dev)
        nxt[:-1] = ids[1:].to(dev)
        within = torch.gather(logprobs, 1, nxt.unsqueeze(-1)).squeeze(-1).double().cpu().numpy()
        nexts = logprobs[torch.from_numpy(starts[1:] - 1).to(dev)]
        slots = self._keep(fresh)
        spans = list(zip(starts[:-1].tolist(), starts[1:].tolist()))
        return self._states(seqs, [slots[r0:r1] for r0, r1 in spans], [within[r0:r1] for r0, r1 in spans], nexts)

    def _tree_pass(self, news, bases, union: List[KVBlock], parts, logits: bool = True):
        """One forward pass of elements' new tokens (``news[e]``, at positions from ``bases[e]``),
        one after another, over ``union``'s blocks of keys and values, each once. A 4D mask lets
        each new token see the union blocks ``parts[e][0]``, all tokens of the elements
        ``parts[e][1]`` of this pass, and its own element's tokens before it (in a
        sliding-window layer, only those within the window). Returns the new tokens' keys and
        values ``[2 * layers, kv_heads, T, head_dim]``, their log-probabilities (None without
        ``logits``) and the token ids."""
        dev = self.device
        offsets = np.cumsum([0] + [b.n for b in union])
        U = int(offsets[-1])
        starts = np.cumsum([0] + [len(n) for n in news])
        T = int(starts[-1])
        ids = torch.tensor([t for n in news for t in n], dtype=torch.long)
        sizes, ns = np.diff(starts), np.array([b.n for b in union], np.int64)
        # the position of each key: the union's blocks', then the new tokens'
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
        graphed = self._graphed(TREE, T, U, 1) if logits else None
        if graphed is not None:  # padded to the graph's shape: its extra keys and rows see nothing else
            Tb, Ub = graphed.rows, graphed.past
            wide = np.zeros((Tb, Ub + Tb), bool)
            wide[:T, :U], wide[:T, Ub:Ub + T] = allowed[:, :U], allowed[:, U:]
            wide[np.arange(T, Tb), Ub + np.arange(T, Tb)] = True
            deep = np.zeros(Ub + Tb, np.int64)
            deep[:U], deep[Ub:Ub + T] = depth[:U], depth[U:]
            allowed, depth, at = wide, deep, Ub
        else:
            Tb, at = T, U
        pos = torch.from_numpy(depth[at:]).unsqueeze(0)
        masks = {}
        for kind, window in self._mask_kinds:
            ok = allowed if window is None else allowed & (depth[at:, None] - depth[None, :] < window)
            m = torch.zeros((1, 1, Tb, at + Tb), dtype=self.dtype)
            m.masked_fill_(torch.from_numpy(~ok), torch.finfo(self.dtype).min)
            masks[kind] = m.to(dev) if graphed is None else graphed.masks[kind].copy_(m)
        mask = masks[None] if None in masks else masks
        cache, buf = _full_cache(), None
        if U:
            for blk in union:
                self._touch(blk)
            if graphed is None:
                # the ancestors' keys and values one after another, with room for the new tokens'
                buf = self._stage.lay_out(union, T, self.pool)  # [2 * layers, kv_heads, >= U + T, head_dim]
                cache = self._preloaded([(buf[2 * i, :, :U + T].unsqueeze(0), buf[2 * i + 1, :, :U + T].unsqueeze(0))
                                         for i in range(buf.shape[0] // 2)], U)
            else:
                # straight into the graph's buffer, its padding and the new tokens' room read as zeros
                self.pool.read(np.concatenate([b.slots for b in union] + [np.full(graphed.kv.shape[2] - U, PAD)]),
                               out=graphed.kv)
        if graphed is None:
            out, logprobs = self._run(ids.unsqueeze(0), mask, pos, cache, T, logits)
        else:
            graphed.ids[0, :T].copy_(ids)
            graphed.pos.copy_(pos)
            out, logprobs = self._run(None, None, None, None, T, run=graphed)
            buf = graphed.kv
        # [2 * layers, kv_heads, T, d]: where the model wrote them, or copied out layer by layer
        if buf is not None and wrote_in_place(out[self._cache_arg]):
            fresh = buf[:, :, at:at + T]
        else:
            layers = _cache_tensors(out[self._cache_arg])
            fresh = torch.stack([t[0, :, at:at + T] for k, v in layers for t in (k, v)], 0)
        return fresh, (logprobs[0, :T] if logits else None), ids

    def _batch_cache(self, chains, past_len, P, N, into=None):
        """The batch's past keys and values, left-padded to ``P``, each followed by room for
        ``N`` new tokens, gathered from the pool at once into the staging buffer: the cache over
        it and the buffer, ``[2 * layers, kv_heads, batch * (P + N), head_dim]`` (``into``: a
        ``graphs.Pass`` whose buffer takes them instead, its rows beyond the batch's zeros; then
        nothing is returned)."""
        pad = np.full(P + N, PAD, np.int64)
        pieces = []
        for chain, n in zip(chains, past_len.tolist()):
            if P - n:
                pieces.append(pad[:P - n])
            for blk in chain or ():
                self._touch(blk)
                pieces.append(blk.slots)
            pieces.append(pad[:N])
        if into is not None:
            pieces += [pad] * (into.rows - len(chains))
            self.pool.read(np.concatenate(pieces), out=into.kv)
            return None
        flat = self._stage.gather(np.concatenate(pieces), self.pool)
        full = flat.view(flat.shape[0], flat.shape[1], len(chains), P + N, flat.shape[3])
        return self._preloaded([(full[2 * i].transpose(0, 1), full[2 * i + 1].transpose(0, 1))
                                for i in range(full.shape[0] // 2)], P), flat

    def _preloaded(self, layers, filled: int):
        """The cache of a call whose past keys and values fill the first ``filled`` positions of
        ``layers``' buffers (or, where the probe found the model does not write where asked, a
        plain cache of copies of them)."""
        if self.preload:
            return preloaded_cache(layers, filled)
        return _full_cache([(k[:, :, :filled], v[:, :, :filled]) for k, v in layers])

    @torch.inference_mode()
    def score(self, token_ids: Sequence[int], state: Optional[ModelState] = None) -> np.ndarray:
        """Log-probability of each token given what precedes it, in one forward pass."""
        if state is not None:
            return super().score(token_ids, state)
        ids = torch.tensor([[self.bos_id] + [int(t) for t in token_ids]], device=self.device)
        logits = self.model(input_ids=ids).logits[0, :-1].float()
        lp = torch.log_softmax(logits, -1)
        return lp[torch.arange(len(token_ids)), ids[0, 1:]].double().cpu().numpy()


def _worst(a: Sequence[ModelState], b: Sequence[ModelState]) -> float:
    """The largest difference between two lists of states' next-token log-probabilities."""
    return max(float((x.logprobs - y.logprobs).abs().max()) for x, y in zip(a, b))


def _agrees(reference: Sequence[ModelState], read) -> bool:
    """Whether ``read()`` gives ``reference``'s log-probabilities (False when it raises)."""
    try:
        return _worst(reference, read()) <= PROBE_TOLERANCE
    except Exception:
        return False


def _full_cache(layers=None):
    """A transformers ``DynamicCache`` holding ``layers`` ((keys, values) per layer), built
    without the model's config: every layer then keeps all its keys (Gemma 3's sliding-window
    layers would drop those outside the window, and the new tokens' keys would be misread); the
    attention mask keeps each layer's window."""
    from transformers import DynamicCache
    return DynamicCache(ddp_cache_data=layers) if layers else DynamicCache()


def _mask_kinds(config) -> List[tuple]:
    """The attention masks a model's layers take, as (name, sliding window or None): one mask
    (name None) for most models; Gemma 3's full and sliding-window layers take one each."""
    window = getattr(config, "sliding_window", None)
    types = set(getattr(config, "layer_types", None) or ())
    if "sliding_attention" in types:
        return [("full_attention", None), ("sliding_attention", window)]
    return [(None, window if window and getattr(config, "use_sliding_window", True) else None)]


def missing_model_files(path: str) -> List[str]:
    """What a transformers model folder lacks: its config, weights or tokenizer files."""
    names = set(os.listdir(path))
    missing = []
    if "config.json" not in names:
        missing.append("config.json")
    if not any(n.endswith((".safetensors", ".bin", ".safetensors.index.json", ".bin.index.json")) for n in names):
        missing.append("weights (model.safetensors or pytorch_model.bin)")
    if not names & {"tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "tokenizer_config.json"}:
        missing.append("tokenizer (tokenizer.json or tokenizer.model)")
    return missing


def _hub_reachable(timeout: float = 2.0) -> bool:
    """Whether the Hugging Face hub answers at all (so a missing model fails fast offline)."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    import socket
    from urllib.parse import urlparse
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def cache_argument(model) -> str:
    """The name under which this transformers version passes and returns a model's key/value
    cache: ``cache`` (newer 5.x releases, which warn about the old name) or ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _cache_tensors(cache):
    """[(keys, values)] per layer from a transformers cache object."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return [(k, v) for k, v in cache]  # pragma: no cover - legacy tuple caches
