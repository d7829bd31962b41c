//! What a request asks for: its batch and sequence length, drawn per
//! request from a seeded RNG, and the bytes of its three buffers.

/// The model's widths, fixed for a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    /// Width of the input and of the middle projection.
    pub hidden: usize,
    /// Width of the inner (activated) layer.
    pub inner: usize,
    /// Width of the output.
    pub out: usize,
    /// The largest batch a request draws.
    pub max_batch: usize,
    /// The largest sequence length a request draws.
    pub max_seq: usize,
}

impl Dims {
    /// The benchmark's model: 256 → 1024 → 256 → 1024 → 64, batches of 1 to
    /// 8, sequences of 16 to 256 tokens (up to 2,048 rows, 10.5 MiB a request).
    pub const BENCH: Dims = Dims {
        hidden: 256,
        inner: 1024,
        out: 64,
        max_batch: 8,
        max_seq: 256,
    };

    /// The most rows a request can have.
    pub fn max_rows(&self) -> usize {
        self.max_batch * self.max_seq
    }
}

/// One request's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestShape {
    /// Sequences in the request.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq: usize,
}

impl RequestShape {
    /// Rows of every matrix of the request (tokens in all).
    pub fn rows(&self) -> usize {
        self.batch * self.seq
    }

    /// `f32` elements of the input / middle buffer, the inner buffer and the
    /// output buffer.
    pub fn elems(&self, dims: &Dims) -> [usize; 3] {
        let rows = self.rows();
        [rows * dims.hidden, rows * dims.inner, rows * dims.out]
    }

    /// Bytes the request asks for, all three buffers.
    pub fn bytes(&self, dims: &Dims) -> usize {
        self.elems(dims).iter().sum::<usize>() * std::mem::size_of::<f32>()
    }
}

/// The seeded stream of request shapes of one client: the same seed gives
/// the same requests to every way.
#[derive(Debug)]
pub struct Shapes {
    rng: fastrand::Rng,
    dims: Dims,
}

impl Shapes {
    /// The shapes of client `client` of a run seeded `seed`.
    pub fn new(seed: u64, client: usize, dims: Dims) -> Self {
        Shapes {
            rng: fastrand::Rng::with_seed(
                seed ^ (client as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            ),
            dims,
        }
    }

    /// The next request: batch in `1..=max_batch`, sequence length a
    /// multiple of 16 in `16..=max_seq`.
    pub fn next_shape(&mut self) -> RequestShape {
        let batch = self.rng.usize(1..=self.dims.max_batch);
        let seq = 16 * self.rng.usize(1..=(self.dims.max_seq / 16).max(1));
        RequestShape { batch, seq }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_are_seeded_in_range_and_vary() {
        let dims = Dims::BENCH;
        let a: Vec<_> = {
            let mut s = Shapes::new(7, 3, dims);
            (0..200).map(|_| s.next_shape()).collect()
        };
        let b: Vec<_> = {
            let mut s = Shapes::new(7, 3, dims);
            (0..200).map(|_| s.next_shape()).collect()
        };
        assert_eq!(a, b, "same seed and client, same requests");
        let other: Vec<_> = {
            let mut s = Shapes::new(7, 4, dims);
            (0..200).map(|_| s.next_shape()).collect()
        };
        assert_ne!(a, other, "another client draws other requests");
        for s in &a {
            assert!((1..=dims.max_batch).contains(&s.batch));
            assert!((16..=dims.max_seq).contains(&s.seq) && s.seq % 16 == 0);
            assert!(s.rows() <= dims.max_rows());
        }
        let distinct: std::collections::HashSet<_> = a.iter().map(|s| s.rows()).collect();
        assert!(
            distinct.len() > 20,
            "sizes vary: {} distinct",
            distinct.len()
        );
        let big = RequestShape { batch: 8, seq: 256 };
        assert_eq!(big.bytes(&dims), 2048 * (256 + 1024 + 64) * 4);
    }
}
