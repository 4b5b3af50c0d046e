//! Files in verified pieces: a file's blake3 hash opened into the hashes of its pieces, so that each piece is checked as it arrives.
//!
//! BLAKE3 hashes a file as a tree of 1 KiB chunks. A piece is an aligned
//! run of a power of two of chunks, so it is a whole subtree, and its
//! chaining value (the subtree's hash) can be checked alone. A sender gives
//! a file's pieces' chaining values first; the receiver checks that they
//! merge into the file's hash (the name it asked for), then checks each
//! piece against its value as it comes. A cut transfer keeps what it
//! wrote, and only the pieces that check out count: it goes on from the
//! first that does not. The `bao` crates do the same with a whole tree of
//! parents; a flat list of at most [`PIECES_MAX`] values is simpler, and
//! small enough to send before the bytes.
//!
//! No I/O here: the node reads and writes the bytes.

use blake3::hazmat::{merge_subtrees_non_root, merge_subtrees_root, HasherExt, Mode};
use blake3::Hasher;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The smallest piece: what a cut transfer may send again at most.
pub const PIECE_MIN: u64 = 1 << 20;
/// A file has at most this many pieces (bigger files have bigger pieces), so
/// their hashes (32 bytes each, 128 KiB in all) travel in one message.
pub const PIECES_MAX: u64 = 4096;

/// A chaining value: the hash of one piece as a subtree of the file's tree.
pub type Cv = [u8; 32];

/// The length of each piece of a file of `size` bytes (the last may be
/// shorter): a power of two of at least [`PIECE_MIN`], with at most
/// [`PIECES_MAX`] pieces.
pub fn piece_len(size: u64) -> u64 {
    size.div_ceil(PIECES_MAX).next_power_of_two().max(PIECE_MIN)
}

/// How many pieces a file of `size` bytes has (an empty file, one).
pub fn piece_count(size: u64) -> u64 {
    size.div_ceil(piece_len(size)).max(1)
}

/// Why a file's bytes or pieces were not taken.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum PieceError {
    /// The chaining values sent do not merge into the file's hash.
    #[error("the file's pieces do not make up its hash")]
    Pieces,
    /// This piece (counting from 0) arrived with bytes of another hash.
    #[error("piece {0} of the file arrived with another hash")]
    Piece(u64),
    /// The bytes do not make up the file: too few of them, or another hash.
    #[error("the file arrived with another hash")]
    File,
    /// More bytes arrived than the file has.
    #[error("more bytes arrived than the file has")]
    TooLong,
}

/// A file's size and its pieces' chaining values (none for a file of one
/// piece: its hash is its piece's).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pieces {
    /// The file's size in bytes.
    pub size: u64,
    /// Each piece's chaining value, in order (empty for a file of one piece).
    pub cvs: Vec<Cv>,
}

impl Pieces {
    /// The file's hash these pieces make up: `None` for a file of one
    /// piece, or when their number does not fit the size.
    fn root(&self) -> Option<Cv> {
        let n = piece_count(self.size);
        (n > 1 && self.cvs.len() as u64 == n).then(|| merge(&self.cvs, true))
    }

    /// Whether these pieces are those of the file named `hash`.
    pub fn check(&self, hash: &Cv) -> Result<(), PieceError> {
        match piece_count(self.size) {
            1 if self.cvs.is_empty() => Ok(()),
            _ if self.root().as_ref() == Some(hash) => Ok(()),
            _ => Err(PieceError::Pieces),
        }
    }

    /// The length of each piece but the last (see [`piece_len`]).
    pub fn piece_len(&self) -> u64 {
        piece_len(self.size)
    }

    /// Where piece `i` starts and ends.
    pub fn range(&self, i: u64) -> (u64, u64) {
        let len = self.piece_len();
        (i * len, ((i + 1) * len).min(self.size))
    }
}

/// The chaining values of pieces `cvs`, merged as blake3's tree does: the
/// left side holds the largest power of two of pieces less than all.
fn merge(cvs: &[Cv], root: bool) -> Cv {
    if cvs.len() == 1 {
        return cvs[0];
    }
    let left = 1usize << (usize::BITS - 1 - (cvs.len() - 1).leading_zeros());
    let (l, r) = (merge(&cvs[..left], false), merge(&cvs[left..], false));
    if root {
        *merge_subtrees_root(&l, &r, Mode::Hash).as_bytes()
    } else {
        merge_subtrees_non_root(&l, &r, Mode::Hash)
    }
}

/// Hashes a file's bytes as they come, in order, piece by piece: what
/// makes a sender's [`Pieces`] ([`PieceHasher::new`]), and checks a
/// receiver's ([`PieceHasher::checking`]) at the end of each piece.
pub struct PieceHasher {
    size: u64,
    piece: u64,
    /// Bytes taken so far.
    at: u64,
    /// Bytes up to the end of the last piece that checked out.
    checked: u64,
    hasher: Hasher,
    /// The values made, or those to check against.
    cvs: Vec<Cv>,
    checking: Option<Cv>,
}

impl PieceHasher {
    /// For a file of `size` bytes, making its pieces.
    pub fn new(size: u64) -> PieceHasher {
        PieceHasher {
            size,
            piece: piece_len(size),
            at: 0,
            checked: 0,
            hasher: Hasher::new(),
            cvs: Vec::new(),
            checking: None,
        }
    }

    /// Checking the bytes of a file named `hash` from piece `from` on,
    /// against `pieces` (already [`Pieces::check`]ed).
    pub fn checking(pieces: &Pieces, hash: Cv, from: u64) -> PieceHasher {
        let piece = pieces.piece_len();
        let at = (from * piece).min(pieces.size);
        let mut hasher = Hasher::new();
        hasher.set_input_offset(at);
        PieceHasher {
            size: pieces.size,
            piece,
            at,
            checked: at,
            hasher,
            cvs: pieces.cvs.clone(),
            checking: Some(hash),
        }
    }

    /// Bytes taken so far, and so where the next ones go.
    pub fn at(&self) -> u64 {
        self.at
    }

    /// Bytes up to the end of the last piece that checked out (the
    /// file's last is checked by [`PieceHasher::finish`]).
    pub fn verified(&self) -> u64 {
        self.checked
    }

    /// Takes the next bytes; the error names the first piece that did not
    /// check out.
    pub fn update(&mut self, mut data: &[u8]) -> Result<(), PieceError> {
        if self.at + data.len() as u64 > self.size {
            return Err(PieceError::TooLong);
        }
        while !data.is_empty() {
            let end = (self.at - self.at % self.piece + self.piece).min(self.size);
            let take = ((end - self.at) as usize).min(data.len());
            self.hasher.update(&data[..take]);
            self.at += take as u64;
            data = &data[take..];
            if self.at == end && self.at < self.size {
                self.end_piece()?;
            }
        }
        Ok(())
    }

    /// The end of piece `self.at / piece - 1` (not the file's last).
    fn end_piece(&mut self) -> Result<(), PieceError> {
        let i = self.at / self.piece - 1;
        let cv = self.hasher.finalize_non_root();
        self.hasher = Hasher::new();
        self.hasher.set_input_offset(self.at);
        match self.checking {
            Some(_) if self.cvs.get(i as usize) != Some(&cv) => return Err(PieceError::Piece(i)),
            Some(_) => {}
            None => self.cvs.push(cv),
        }
        self.checked = self.at;
        Ok(())
    }

    /// Once every byte is in: the file's hash and pieces, or (checking)
    /// whether the last piece, and so the whole file, checks out.
    pub fn finish(mut self) -> Result<(Cv, Pieces), PieceError> {
        if self.at != self.size {
            return Err(PieceError::File);
        }
        let one = piece_count(self.size) == 1;
        let hash = if one {
            *self.hasher.finalize().as_bytes()
        } else {
            let cv = self.hasher.finalize_non_root();
            let last = piece_count(self.size) as usize - 1;
            match self.checking {
                Some(_) if self.cvs.get(last) != Some(&cv) => {
                    return Err(PieceError::Piece(last as u64))
                }
                Some(_) => {}
                None => self.cvs.push(cv),
            }
            merge(&self.cvs, true)
        };
        if let Some(want) = self.checking {
            if want != hash {
                return Err(PieceError::File);
            }
        }
        let pieces = Pieces {
            size: self.size,
            cvs: if one { Vec::new() } else { self.cvs },
        };
        Ok((hash, pieces))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bytes(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
            .collect()
    }

    fn made(data: &[u8], step: usize) -> (Cv, Pieces) {
        let mut h = PieceHasher::new(data.len() as u64);
        for part in data.chunks(step.max(1)) {
            h.update(part).unwrap();
        }
        h.finish().unwrap()
    }

    #[test]
    fn piece_lengths_are_powers_of_two_with_a_bounded_count() {
        assert_eq!(piece_len(0), PIECE_MIN);
        assert_eq!(piece_count(0), 1);
        assert_eq!(piece_count(PIECE_MIN), 1);
        assert_eq!(piece_count(PIECE_MIN + 1), 2);
        assert_eq!(piece_len(6 << 30), 2 << 20);
        for size in [1u64 << 40, (1 << 44) + 7, u64::MAX / 2] {
            assert!(piece_len(size).is_power_of_two());
            assert!(piece_count(size) <= PIECES_MAX, "{size}");
        }
    }

    #[test]
    fn the_pieces_of_a_file_make_up_its_blake3_hash_whatever_its_size() {
        let p = PIECE_MIN as usize;
        for size in [0, 1, 1024, p - 1, p, p + 1, 3 * p, 5 * p + 4097] {
            let data = bytes(size, 3);
            let (hash, pieces) = made(&data, 100_003);
            assert_eq!(hash, *blake3::hash(&data).as_bytes(), "{size}");
            assert_eq!(
                pieces.cvs.len() as u64,
                piece_count(size as u64) * (size > p) as u64
            );
            pieces.check(&hash).unwrap();
            let mut c = PieceHasher::checking(&pieces, hash, 0);
            c.update(&data).unwrap();
            assert_eq!(c.finish().unwrap().0, hash);
        }
    }

    #[test]
    fn a_changed_byte_is_caught_in_its_own_piece_and_what_came_before_stays_verified() {
        let p = PIECE_MIN as usize;
        let data = bytes(4 * p + 10, 9);
        let (hash, pieces) = made(&data, p);
        let mut bad = data.clone();
        bad[2 * p + 5] ^= 1;
        let mut c = PieceHasher::checking(&pieces, hash, 0);
        assert_eq!(c.update(&bad), Err(PieceError::Piece(2)));
        assert_eq!(c.verified(), 2 * p as u64);
        // The last, short piece is checked at the end.
        let mut bad = data.clone();
        *bad.last_mut().unwrap() ^= 1;
        let mut c = PieceHasher::checking(&pieces, hash, 0);
        c.update(&bad).unwrap();
        assert_eq!(c.finish(), Err(PieceError::Piece(4)));
        // A single-piece file is checked whole.
        let small = bytes(1000, 1);
        let (hash, pieces) = made(&small, 7);
        let mut c = PieceHasher::checking(&pieces, hash, 0);
        let mut bad = small.clone();
        bad[0] ^= 1;
        c.update(&bad).unwrap();
        assert_eq!(c.finish(), Err(PieceError::File));
    }

    #[test]
    fn pieces_that_do_not_make_up_the_hash_asked_for_are_refused() {
        let p = PIECE_MIN as usize;
        let data = bytes(3 * p, 4);
        let (hash, mut pieces) = made(&data, p);
        pieces.cvs[1][0] ^= 1;
        assert_eq!(pieces.check(&hash), Err(PieceError::Pieces));
        pieces.cvs.pop();
        assert_eq!(pieces.check(&hash), Err(PieceError::Pieces));
        let (_, ok) = made(&data, p);
        assert_eq!(ok.check(&[0; 32]), Err(PieceError::Pieces));
        // A file of one piece has no values to send; any sent are refused.
        let one = Pieces {
            size: 10,
            cvs: vec![[0; 32]],
        };
        assert_eq!(one.check(&[0; 32]), Err(PieceError::Pieces));
    }

    #[test]
    fn more_bytes_than_the_size_are_refused() {
        let (hash, pieces) = made(&[1, 2, 3], 1);
        let mut c = PieceHasher::checking(&pieces, hash, 0);
        assert_eq!(c.update(&[1, 2, 3, 4]), Err(PieceError::TooLong));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// A transfer cut anywhere and taken up from its last verified
        /// piece checks out the same as one in one go.
        #[test]
        fn a_transfer_resumed_from_its_last_verified_piece_checks_out(
            size in 0usize..(5 << 20),
            cut in 0.0f64..1.0,
            step in 1usize..300_000,
        ) {
            let data = bytes(size, 7);
            let (hash, pieces) = made(&data, step);
            prop_assert_eq!(hash, *blake3::hash(&data).as_bytes());
            let mut first = PieceHasher::checking(&pieces, hash, 0);
            let cut = (size as f64 * cut) as usize;
            for part in data[..cut].chunks(step) {
                first.update(part).unwrap();
            }
            let from = first.verified();
            prop_assert!(from <= cut as u64);
            prop_assert!(cut as u64 - from < pieces.piece_len() || cut == size);
            let piece = from / pieces.piece_len();
            let mut again = PieceHasher::checking(&pieces, hash, piece);
            prop_assert_eq!(again.at(), piece * pieces.piece_len());
            for part in data[again.at() as usize..].chunks(step) {
                again.update(part).unwrap();
            }
            prop_assert_eq!(again.finish().unwrap().0, hash);
        }
    }
}
