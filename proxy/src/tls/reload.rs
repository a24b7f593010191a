//! Rotation without restart: a configuration built from files is rebuilt when any of its files changes.
//!
//! Every new connection asks for the current configuration; that reads the files (a few KiB, next to a handshake's
//! public-key operations) and compares them with what the configuration was last built from. Contents, not
//! timestamps: a file rewritten in place within one timestamp tick is still seen. A change that does not load (a
//! key that does not match its certificate yet, half a file, a certificate that expired) is logged once and the
//! last good configuration stays in use until the files change again: never a crash, never plaintext. Connections
//! already open keep the configuration they were made with.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::TlsError;

type Build<C> = Box<dyn Fn() -> Result<C, TlsError> + Send + Sync>;

/// A configuration of type `C` kept current with the files it is built from.
pub struct Reloading<C> {
    /// What this configuration is, for logs ("TLS towards clients").
    what: &'static str,
    files: Vec<PathBuf>,
    build: Build<C>,
    state: Mutex<State<C>>,
}

struct State<C> {
    /// The files' contents when a build was last attempted (`None`: unreadable then).
    seen: Vec<Option<Vec<u8>>>,
    current: Arc<C>,
}

impl<C> Reloading<C> {
    /// Builds the first configuration; an error here stops the proxy at start.
    pub fn new(
        what: &'static str,
        files: Vec<PathBuf>,
        build: impl Fn() -> Result<C, TlsError> + Send + Sync + 'static,
    ) -> Result<Self, TlsError> {
        let seen = read_all(&files);
        let current = Arc::new(build()?);
        Ok(Self {
            what,
            files,
            build: Box::new(build),
            state: Mutex::new(State { seen, current }),
        })
    }

    /// The configuration for a new connection: rebuilt first if a file changed since the last attempt.
    pub fn current(&self) -> Arc<C> {
        let now = read_all(&self.files);
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if now != state.seen {
            state.seen = now;
            match (self.build)() {
                Ok(config) => {
                    state.current = Arc::new(config);
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
        state.current.clone()
    }
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

    #[test]
    fn a_changed_file_is_used_and_a_bad_one_keeps_the_last_good() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cert.pem");
        std::fs::write(&path, "one").unwrap();
        let reloading = text_config(path.clone()).unwrap();
        assert_eq!(*reloading.current(), "one");
        // Same length, rewritten in place at once: seen by content, whatever the timestamps say.
        std::fs::write(&path, "two").unwrap();
        assert_eq!(*reloading.current(), "two");
        std::fs::write(&path, "bad").unwrap();
        assert_eq!(*reloading.current(), "two");
        std::fs::remove_file(&path).unwrap();
        assert_eq!(*reloading.current(), "two");
        std::fs::write(&path, "three").unwrap();
        assert_eq!(*reloading.current(), "three");
    }

    #[test]
    fn files_that_do_not_load_at_start_are_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cert.pem");
        std::fs::write(&path, "bad").unwrap();
        assert_eq!(text_config(path).err(), Some(TlsError("bad".into())));
    }
}
