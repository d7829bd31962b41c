//! Size classes: which cached blocks can serve a request.
//!
//! A request is rounded up to its class size, and the block is allocated
//! from the inner resource at that size, so that any later request of the
//! same class fits it. Classes are powers of two split into four steps per
//! doubling (512, 640, 768, 896, 1024, 1280, ...), starting at
//! [`MIN_CLASS_SIZE`]: rounding wastes at most a quarter of a request (a
//! fifth on average), while a pure power-of-two scheme wastes up to half.

/// The smallest class: requests of fewer bytes are rounded up to it.
pub const MIN_CLASS_SIZE: usize = 512;

const MIN_SHIFT: u32 = MIN_CLASS_SIZE.trailing_zeros();
/// Steps per doubling (a power of two).
const STEPS: usize = 4;
const STEP_SHIFT: u32 = STEPS.trailing_zeros();

/// A size class: an index into the free lists, and the size its blocks have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SizeClass(u16);

impl SizeClass {
    /// The class of a request of `bytes` bytes (`bytes > 0`); classes grow
    /// with the request, and `class.size() >= bytes`.
    ///
    /// `None` when the class size would not fit a `usize` (requests above
    /// 2^63 + 3 * 2^61 bytes on a 64-bit target): no cache can hold such a
    /// block, and the request bypasses the classes.
    pub fn of(bytes: usize) -> Option<SizeClass> {
        if bytes <= MIN_CLASS_SIZE {
            return Some(SizeClass(0));
        }
        // 2^p < bytes <= 2^(p+1); the doubling is cut into STEPS equal steps.
        let p = usize::BITS - 1 - (bytes - 1).leading_zeros();
        let base = 1usize << p;
        let step_shift = p - STEP_SHIFT;
        let sub = (bytes - base).div_ceil(1 << step_shift);
        // The class size, base + sub steps, must itself fit.
        base.checked_add(sub << step_shift)?;
        Some(SizeClass(((p - MIN_SHIFT) as usize * STEPS + sub) as u16))
    }

    /// The index of the class, for the free lists (0 for [`MIN_CLASS_SIZE`]).
    pub fn index(self) -> usize {
        self.0 as usize
    }

    /// The size of every block of this class.
    pub fn size(self) -> usize {
        let i = self.0 as usize;
        if i == 0 {
            return MIN_CLASS_SIZE;
        }
        let (doubling, sub) = ((i - 1) / STEPS, (i - 1) % STEPS + 1);
        let p = MIN_SHIFT as usize + doubling;
        (1usize << p) + (sub << (p - STEP_SHIFT as usize))
    }

    /// The class at `index` (the inverse of [`index`](Self::index)).
    pub(crate) fn from_index(index: usize) -> SizeClass {
        SizeClass(index as u16)
    }

    /// How many classes serve requests up to `max_bytes` (every class whose
    /// size fits a `usize`, for a larger `max_bytes`).
    pub fn count_up_to(max_bytes: usize) -> usize {
        let largest = SizeClass::of(max_bytes.max(1)).unwrap_or(SizeClass::LARGEST);
        largest.index() + 1
    }

    /// The largest class whose size fits a `usize`.
    const LARGEST: SizeClass =
        SizeClass(((usize::BITS - 1 - MIN_SHIFT) as usize * STEPS + STEPS - 1) as u16);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_requests_with_bounded_waste() {
        let mut last = SizeClass(0);
        for bytes in (1..70_000).chain([1 << 20, (1 << 20) + 1, 64 << 20]) {
            let class = SizeClass::of(bytes).unwrap();
            assert!(class >= last || bytes == 1 << 20, "{bytes}");
            last = class;
            assert!(class.size() >= bytes, "{bytes} -> {}", class.size());
            assert!(
                class.size() <= (bytes + bytes / 4).max(MIN_CLASS_SIZE),
                "{bytes}"
            );
            assert_eq!(
                SizeClass::of(class.size()),
                Some(class),
                "a class size is its own class"
            );
        }
        let sizes: Vec<usize> = (0..6).map(|i| SizeClass(i).size()).collect();
        assert_eq!(sizes, [512, 640, 768, 896, 1024, 1280]);
        assert_eq!(SizeClass::count_up_to(64 << 20), 69);
    }

    /// Issue 18: `SizeClass::of(usize::MAX).size()` overflowed (a panic in
    /// debug, 0 in release). A class whose size does not fit is refused.
    #[test]
    fn size_arithmetic_near_usize_max_is_checked() {
        assert_eq!(SizeClass::of(usize::MAX), None);
        let largest = SizeClass::LARGEST.size();
        assert_eq!(SizeClass::of(largest), Some(SizeClass::LARGEST));
        assert_eq!(SizeClass::of(largest + 1), None);
        for bytes in [
            largest - 1,
            1 << (usize::BITS - 1),
            (1 << (usize::BITS - 1)) + 1,
        ] {
            let class = SizeClass::of(bytes).unwrap();
            assert!(class.size() >= bytes, "{bytes}");
        }
        assert_eq!(
            SizeClass::count_up_to(usize::MAX),
            SizeClass::LARGEST.index() + 1
        );
    }
}
