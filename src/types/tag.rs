//! [`Tag`]: what an allocation is for ([`AllocTag`], a static kind) and,
//! optionally, which request it serves (an owned identity).
//!
//! The resources of a stack see only the kind: statistics group by it, and
//! it is a copy of two words, so a tag costs nothing per call. The identity
//! lives in the futures layer, which is where a request waits: its span
//! (see [`AsyncResource::allocate`](crate::AsyncResource::allocate))
//! carries it, so every event a layer below emits while the request is
//! served or refused is attributed to the request. Making a tag with an
//! identity costs the identity's `Arc<str>` (once per request, shared by
//! its allocations through a clone); a tag without one costs nothing more
//! than an [`AllocTag`].

#![forbid(unsafe_code)]

use std::fmt;
use std::sync::Arc;

use super::AllocTag;

/// An allocation's tag: a static kind, which statistics group by, and
/// optionally the identity of the request it serves.
///
/// Every function that takes a tag takes `impl Into<Tag>`: an
/// [`AllocTag`], a `&'static str` or a `Tag`.
///
/// # Examples
/// ```
/// use streamalloc::Tag;
/// use streamalloc::AllocTag;
///
/// let plain: Tag = AllocTag("weights").into();
/// assert_eq!(plain.kind(), AllocTag("weights"));
/// assert_eq!(plain.request(), None);
///
/// let tagged = Tag::for_request("input", format!("req-{}", 42));
/// assert_eq!(tagged.kind(), AllocTag("input"));
/// assert_eq!(tagged.request(), Some("req-42"));
/// assert_eq!(tagged.to_string(), "input[req-42]");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Tag {
    kind: AllocTag,
    request: Option<Arc<str>>,
}

impl Tag {
    /// A tag of kind `kind`, with no request identity.
    pub const fn new(kind: &'static str) -> Tag {
        Tag {
            kind: AllocTag(kind),
            request: None,
        }
    }

    /// A tag of kind `kind` for the request named `id`.
    pub fn for_request(kind: &'static str, id: impl Into<Arc<str>>) -> Tag {
        Tag {
            kind: AllocTag(kind),
            request: Some(id.into()),
        }
    }

    /// This tag's kind, for the request named `id`.
    pub fn with_request(&self, id: impl Into<Arc<str>>) -> Tag {
        Tag {
            kind: self.kind,
            request: Some(id.into()),
        }
    }

    /// The static kind: what the resources of the stack see, and what
    /// statistics group by.
    pub fn kind(&self) -> AllocTag {
        self.kind
    }

    /// The request's identity, if the tag has one.
    pub fn request(&self) -> Option<&str> {
        self.request.as_deref()
    }
}

impl From<AllocTag> for Tag {
    fn from(kind: AllocTag) -> Tag {
        Tag {
            kind,
            request: None,
        }
    }
}

impl From<&'static str> for Tag {
    fn from(kind: &'static str) -> Tag {
        Tag::new(kind)
    }
}

impl From<&Tag> for Tag {
    fn from(tag: &Tag) -> Tag {
        tag.clone()
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.request {
            Some(id) => write!(f, "{}[{id}]", self.kind),
            None => write!(f, "{}", self.kind),
        }
    }
}
