//! [`CaptureId`]: the driver's id of one stream capture.

/// The driver's id of one capture sequence (`cuStreamGetCaptureInfo`'s
/// `id_out`): unique among the captures of the process, so that memory
/// handed out during a capture can be tied to the graph it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CaptureId(u64);

impl CaptureId {
    /// The id from the driver's bits.
    pub fn new(id: u64) -> Self {
        CaptureId(id)
    }

    /// The driver's bits.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for CaptureId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "capture {}", self.0)
    }
}
