//! Stdout that its reader may close: `mesh status | head` ends quietly with status 0, as `ls | head` does.
//!
//! Rust ignores SIGPIPE, so a write to a pipe whose reader is gone fails
//! with EPIPE: `println!` panicked on it, and `writeln!(...)?` ended the
//! command with `error: Broken pipe`. Every command's printing goes
//! through here instead; a node's own lines (`mesh node`) do not, as a
//! node must not stop because its stdout did.

use std::fmt;
use std::io::{self, Write};

/// Stdout, locked. A write that finds the reader gone ends the process
/// with status 0 (nothing more it prints can be read); other errors are
/// returned as they are.
pub struct Out(io::StdoutLock<'static>);

pub fn stdout() -> Out {
    Out(io::stdout().lock())
}

impl Write for Out {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf).map_err(reader_gone)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush().map_err(reader_gone)
    }
}

/// Ends the process quietly when `e` says the reader went away.
fn reader_gone(e: io::Error) -> io::Error {
    if closed(&e) {
        // Exit flushes stdout once more; that error is dropped there.
        std::process::exit(0);
    }
    e
}

/// True for the error a write to a closed pipe gets.
pub fn closed(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::BrokenPipe
}

/// What `print!` does, through [`Out`]. Any other failure to write
/// (a full disk under `> file`) ends the command with status 2, said on
/// stderr, rather than a panic.
pub fn print(args: fmt::Arguments<'_>) {
    if let Err(e) = stdout().write_fmt(args) {
        eprintln!("error: cannot write to stdout: {e}");
        std::process::exit(i32::from(crate::EXIT_BAD_INPUT));
    }
}

/// `println!` through [`Out`].
macro_rules! outln {
    () => {
        $crate::out::print(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::out::print(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` through [`Out`].
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::out::print(format_args!($($arg)*))
    };
}

pub(crate) use {out, outln};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_closed_pipe_is_taken_for_a_reader_gone() {
        // A real pipe whose reader is gone: the error a print to it gets.
        let (r, mut w) = io::pipe().expect("pipe");
        drop(r);
        let e = w.write_all(b"x").expect_err("no reader");
        assert!(closed(&e), "{e:?}");
        assert!(!closed(&io::Error::from(io::ErrorKind::StorageFull)));
        assert!(!closed(&io::Error::from(io::ErrorKind::PermissionDenied)));
    }
}
