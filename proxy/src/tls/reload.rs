//! Rotation without restart: a configuration built from files is rebuilt when any of its files changes.
//!
//! A thread of its own (one per configuration, never a runtime thread) looks at the files' metadata every
//! [`POLL`] and reads them only when it changed: a new connection takes the current configuration without any
//! file I/O or wait, so a slow disk or a stalled network file system can delay a rotation, never a connection.
//! Contents decide, not timestamps: a file rewritten in place within one timestamp tick keeps its metadata, so for
//! [`RACY_POLLS`] looks after a change the contents are read again whatever the metadata says. A change that does
//! not load (a key that does not match its certificate yet, half a file, a certificate that expired) is logged once
//! and the last good configuration stays in use until the files change again: never a crash, never plaintext.
//! Connections already open keep the configuration they were made with.
//!
//! The thread's clock is the real one: it only ever replaces the configuration when files change, which a
//! simulation's files never do, so it cannot make a seeded run differ.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::TlsError;

type Build<C> = Box<dyn Fn() -> Result<C, TlsError> + Send + Sync>;

/// How often the files' metadata is looked at: a rotation takes effect for connections made this long after it.
pub const POLL: Duration = Duration::from_millis(100);

/// For how many looks after a change of metadata the contents are read anyway: file systems stamp times at a
/// coarse tick (a few milliseconds), so a second write of the same length within one tick changes nothing else.
const RACY_POLLS: u32 = 10;

/// A configuration of type `C` kept current with the files it is built from.
pub struct Reloading<C> {
    shared: Arc<Shared<C>>,
}

struct Shared<C> {
    /// What this configuration is, for logs ("TLS towards clients").
    what: &'static str,
    files: Vec<PathBuf>,
    build: Build<C>,
    current: Mutex<Arc<C>>,
}

/// What the watching thread knows of the files.
struct Seen {
    /// Their metadata at the last look (`None`: not there then).
    stamps: Vec<Option<Stamp>>,
    /// Their contents when a build was last attempted (`None`: unreadable then).
    contents: Vec<Option<Vec<u8>>>,
    /// Looks left in which the contents are read even if the metadata did not change.
    racy: u32,
    /// How many times the contents were read (tests count them).
    reads: usize,
}

/// What a file's metadata says of its identity and last change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    device: u64,
    inode: u64,
    len: u64,
    modified: (i64, i64),
    changed: (i64, i64),
}

impl<C: Send + Sync + 'static> Reloading<C> {
    /// Builds the first configuration (an error here stops the proxy at start) and starts watching the files.
    pub fn new(
        what: &'static str,
        files: Vec<PathBuf>,
        build: impl Fn() -> Result<C, TlsError> + Send + Sync + 'static,
    ) -> Result<Self, TlsError> {
        let mut seen = Seen {
            stamps: stamp_all(&files),
            contents: read_all(&files),
            racy: RACY_POLLS,
            reads: 1,
        };
        let shared = Arc::new(Shared {
            what,
            files,
            current: Mutex::new(Arc::new(build()?)),
            build: Box::new(build),
        });
        let watched = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name("tls-files".into())
            .spawn(move || watch(&watched, &mut seen))
            .map_err(|e| {
                TlsError(format!(
                    "cannot start the thread that watches the TLS files: {e}"
                ))
            })?;
        Ok(Self { shared })
    }
}

impl<C> Reloading<C> {
    /// The configuration for a new connection: the last good one built from the files.
    pub fn current(&self) -> Arc<C> {
        self.shared
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Looks at the files every [`POLL`] until the configuration is dropped.
fn watch<C>(shared: &Weak<Shared<C>>, seen: &mut Seen) {
    loop {
        // The watcher's own real-time pause, off every runtime (see the module's last paragraph).
        #[allow(clippy::disallowed_methods)]
        std::thread::sleep(POLL);
        let Some(shared) = shared.upgrade() else {
            return;
        };
        shared.look(seen);
    }
}

impl<C> Shared<C> {
    /// One look at the files: rebuilds the configuration if their contents changed.
    fn look(&self, seen: &mut Seen) {
        let stamps = stamp_all(&self.files);
        if stamps != seen.stamps {
            seen.stamps = stamps;
            seen.racy = RACY_POLLS;
        } else if seen.racy == 0 {
            return;
        } else {
            seen.racy -= 1;
        }
        let contents = read_all(&self.files);
        seen.reads += 1;
        if contents == seen.contents {
            return;
        }
        seen.contents = contents;
        match (self.build)() {
            Ok(config) => {
                *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(config);
                tracing::info!(
                    what = self.what,
                    "TLS files changed: new connections use them"
                );
            }
            Err(err) => tracing::warn!(
                what = self.what,
                %err,
                "TLS files changed but do not load: keeping the last good configuration"
            ),
        }
    }
}

fn stamp_all(files: &[PathBuf]) -> Vec<Option<Stamp>> {
    files
        .iter()
        .map(|f| {
            let m = std::fs::metadata(f).ok()?;
            Some(Stamp {
                device: m.dev(),
                inode: m.ino(),
                len: m.len(),
                modified: (m.mtime(), m.mtime_nsec()),
                changed: (m.ctime(), m.ctime_nsec()),
            })
        })
        .collect()
}

fn read_all(files: &[PathBuf]) -> Vec<Option<Vec<u8>>> {
    files.iter().map(|f| std::fs::read(f).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A "configuration" that is the file's text, refused when the text is "bad".
    fn text_config(path: PathBuf) -> Result<Reloading<String>, TlsError> {
        let file = path.clone();
        Reloading::new("test", vec![path], move || {
            let text = std::fs::read_to_string(&file).map_err(|e| TlsError(e.to_string()))?;
            if text == "bad" {
                return Err(TlsError("bad".into()));
            }
            Ok(text)
        })
    }

    /// A configuration and its files looked at by hand, one look per call, without the thread's timing.
    struct ByHand {
        shared: Arc<Shared<String>>,
        seen: Seen,
    }

    impl ByHand {
        fn new(path: PathBuf) -> Self {
            let reloading = text_config(path).unwrap();
            let files = reloading.shared.files.clone();
            Self {
                shared: reloading.shared,
                seen: Seen {
                    stamps: stamp_all(&files),
                    contents: read_all(&files),
                    racy: RACY_POLLS,
                    reads: 1,
                },
            }
        }

        fn after_look(&mut self) -> String {
            self.shared.look(&mut self.seen);
            self.shared.current.lock().unwrap().to_string()
        }
    }

    #[test]
    fn a_changed_file_is_used_and_a_bad_one_keeps_the_last_good() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cert.pem");
        std::fs::write(&path, "one").unwrap();
        let mut files = ByHand::new(path.clone());
        assert_eq!(files.after_look(), "one");
        // Same length, rewritten in place at once: seen by content, whatever the timestamps say.
        std::fs::write(&path, "two").unwrap();
        assert_eq!(files.after_look(), "two");
        std::fs::write(&path, "bad").unwrap();
        assert_eq!(files.after_look(), "two");
        std::fs::remove_file(&path).unwrap();
        assert_eq!(files.after_look(), "two");
        std::fs::write(&path, "three").unwrap();
        assert_eq!(files.after_look(), "three");
    }

    #[test]
    fn unchanged_files_are_not_read_again_once_the_racy_looks_are_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cert.pem");
        std::fs::write(&path, "one").unwrap();
        let mut files = ByHand::new(path.clone());
        for _ in 0..RACY_POLLS {
            files.after_look();
        }
        let reads = files.seen.reads;
        for _ in 0..100 {
            assert_eq!(files.after_look(), "one");
        }
        assert_eq!(files.seen.reads, reads, "no read while nothing changed");
        // A new file put in place (a new inode, as an atomic rotation does) is read at the next look.
        let next = dir.path().join("next.pem");
        std::fs::write(&next, "two").unwrap();
        std::fs::rename(&next, &path).unwrap();
        assert_eq!(files.after_look(), "two");
        assert_eq!(files.seen.reads, reads + 1);
    }

    #[tokio::test]
    async fn the_thread_puts_a_rotation_in_place_and_new_connections_take_it_without_io() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cert.pem");
        std::fs::write(&path, "one").unwrap();
        let reloading = text_config(path.clone()).unwrap();
        assert_eq!(*reloading.current(), "one");
        std::fs::write(&path, "two").unwrap();
        // The watcher's own pace; a deadline only keeps a broken watcher from hanging the test.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while *reloading.current() != "two" {
            assert!(tokio::time::Instant::now() < deadline, "rotation seen");
            tokio::time::sleep(POLL).await;
        }
    }

    #[test]
    fn files_that_do_not_load_at_start_are_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cert.pem");
        std::fs::write(&path, "bad").unwrap();
        assert_eq!(text_config(path).err(), Some(TlsError("bad".into())));
    }
}
