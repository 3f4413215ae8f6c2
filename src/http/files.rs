//! A set's resource files, served from its `resource_root_dir` under `/files/<set>/`.
//!
//! The way nginx serves them without aio: a file is opened and its metadata read on the
//! serving thread (page-cache hits cost microseconds); a small one (up to [`SMALL`]) is read
//! there in one call and answered from memory, a larger one streams from the blocking pool
//! in chunks. A request costs no hop between threads unless the file is large. Validators
//! come from the file's length and modification time (an ETag like nginx's), so conditional
//! requests and single ranges are answered the same way as the documents'.

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use std::io::Read;
use std::path::PathBuf;

use super::documents::{respond, Body_, Representation};
use super::AppState;
use crate::error::AppError;

/// Files up to this size are read whole on the serving thread.
pub const SMALL: u64 = 64 * 1024;

/// The file under `root` that the (already percent-decoded) path `rel` names: `None` for a
/// path that climbs out (`..`), names the root itself or holds a NUL or a backslash.
pub fn resolve(root: &std::path::Path, rel: &str) -> Option<PathBuf> {
    let mut path = root.to_path_buf();
    let mut any = false;
    for seg in rel.split('/') {
        match seg {
            "" | "." => {}
            ".." => return None,
            s if s.contains(['\0', '\\']) => return None,
            // A collector's downloads under way and scratch files, never a resource.
            s if s.starts_with(".rshub-") => return None,
            s => {
                path.push(s);
                any = true;
            }
        }
    }
    any.then_some(path)
}

fn not_found() -> AppError {
    AppError::NotFound("not found: no such resource file".into())
}

/// `GET`/`HEAD /files/<set>/<rel>`.
pub async fn serve(
    st: State<AppState>,
    root: std::sync::Arc<PathBuf>,
    Path(rel): Path<String>,
    headers: HeaderMap,
) -> Result<Response, AppError> {
    let path = resolve(&root, &rel).ok_or_else(not_found)?;
    let mut file = std::fs::File::open(&path).map_err(|_| not_found())?;
    let meta = file.metadata().map_err(|_| not_found())?;
    if !meta.is_file() {
        return Err(not_found());
    }
    let (etag, last_modified) = super::documents::file_validators(&meta);
    let accel = !st.config.server.accel_redirect.is_empty();
    let body = if meta.len() <= SMALL && !accel {
        let mut buf = Vec::with_capacity(meta.len() as usize);
        // A file that grows while read is cut at the length its validators name.
        (&mut file)
            .take(meta.len())
            .read_to_end(&mut buf)
            .map_err(|e| AppError::Busy(format!("reading the resource file failed: {e}")))?;
        if buf.len() as u64 != meta.len() {
            return Err(AppError::Busy(
                "the resource file changed while it was read; try again".into(),
            ));
        }
        Body_::Memory(bytes::Bytes::from(buf))
    } else {
        Body_::File(file)
    };
    let content_type = mime_guess::from_path(&path)
        .first_raw()
        .unwrap_or("application/octet-stream");
    Ok(respond(
        &st,
        &headers,
        Representation {
            etag: &etag,
            last_modified,
            len: meta.len(),
            content_type,
            gzip: false,
            vary: false,
            file: Some(&path),
        },
        body,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_under_the_root() {
        let root = std::path::Path::new("/srv/a");
        assert_eq!(
            resolve(root, "d0/r0.txt"),
            Some(PathBuf::from("/srv/a/d0/r0.txt"))
        );
        assert_eq!(
            resolve(root, "/d0//./r0.txt"),
            Some(PathBuf::from("/srv/a/d0/r0.txt"))
        );
        for bad in [
            "",
            "/",
            ".",
            "../etc/passwd",
            "d0/../../x",
            "a\0b",
            "a\\..\\b",
        ] {
            assert_eq!(resolve(root, bad), None, "{bad:?}");
        }
    }
}
