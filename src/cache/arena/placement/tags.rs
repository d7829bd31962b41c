//! The [`Freed`] tags of the [`Arena`]'s ranges ("Tags" in the
//! placement's essay): a range one stream freed keeps its one tag in its
//! node, a range several did a list of them (one per stream, the newest),
//! recycled as ranges merge and split. [`free_tags`](Arena::free_tags)
//! and [`freed`](Arena::freed) report them, [`add_tags`](Arena::add_tags)
//! adds the frees of memory moved under a free range.
//!
//! # Stream ordering
//!
//! A tag names a free a later user must be ordered after; tags only
//! grow here (the newest free of each stream kept). Only a merge drops
//! tags, those the caller's `done` names (the arena tier names none).

#![forbid(unsafe_code)]

use super::super::freed::Freed;
use super::{Arena, NIL, Placed};

impl Arena {
    /// The tags of the free range `node` (see [`free_nodes`](Self::free_nodes)).
    pub(crate) fn free_tags(&self, node: u32) -> &[Freed] {
        debug_assert!(self.nodes[node as usize].free, "node {node} is handed out");
        self.tags(node)
    }

    /// Adds `extra` to the tags of the free range `node` (the newest free
    /// of each stream kept): what a reuse of any of it must now be
    /// ordered after too. Memory moved under part of it (an alias)
    /// brings the frees its old uses end with.
    pub(crate) fn add_tags(&mut self, node: u32, extra: &[Freed]) {
        debug_assert!(self.nodes[node as usize].free, "node {node} is handed out");
        let mut all = self.tags(node).to_vec();
        for &t in extra.iter().filter(|t| !t.is_clean()) {
            match all.iter_mut().find(|u| u.slot() == t.slot()) {
                Some(u) => *u = u.join(t).unwrap_or(t),
                None => all.push(t),
            }
        }
        self.unlink_free(node);
        self.set_tags(node, &all);
        self.push_free(node);
    }

    /// The tags of the range `placed` lies in (as they were when handed
    /// out): none when clean.
    pub(crate) fn freed(&self, placed: Placed) -> &[Freed] {
        self.tags(placed.node)
    }

    pub(super) fn tags(&self, i: u32) -> &[Freed] {
        let n = &self.nodes[i as usize];
        match n.set {
            NIL if n.freed.is_clean() => &[],
            NIL => std::slice::from_ref(&n.freed),
            s => &self.sets[s as usize],
        }
    }

    /// A tag list holding `tags`: a spare one (emptied, its room kept)
    /// when there is one.
    pub(super) fn new_set(&mut self, tags: &[Freed]) -> u32 {
        match self.spare_sets.pop() {
            Some(s) => {
                self.sets[s as usize].extend_from_slice(tags);
                s
            }
            None => {
                self.sets.push(tags.to_vec());
                (self.sets.len() - 1) as u32
            }
        }
    }

    /// Sets node `i`'s tag to the one `freed` (clean: none).
    pub(super) fn set_one(&mut self, i: u32, freed: Freed) {
        let old = std::mem::replace(&mut self.nodes[i as usize].set, NIL);
        if old != NIL {
            self.sets[old as usize].clear();
            self.spare_sets.push(old);
        }
        self.nodes[i as usize].freed = freed;
    }

    /// Sets node `i`'s tags to `tags` (done ones already dropped).
    pub(super) fn set_tags(&mut self, i: u32, tags: &[Freed]) {
        let old = self.nodes[i as usize].set;
        let [first, _, ..] = *tags else {
            self.set_one(i, tags.first().copied().unwrap_or(Freed::CLEAN));
            return;
        };
        self.nodes[i as usize].freed = first;
        if old != NIL {
            let set = &mut self.sets[old as usize];
            set.clear();
            set.extend_from_slice(tags);
        } else {
            let s = self.new_set(tags);
            self.nodes[i as usize].set = s;
        }
    }
}
