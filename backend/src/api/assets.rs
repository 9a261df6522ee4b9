//! The built widget (`CHECKOUT_STATIC_DIR`) as the server holds it: the payment page's HTML
//! (with the hashes of its inline scripts, for the policy) and the files, each compressed once
//! (brotli and gzip; again if it changes on disk) by a thread started with the server. What is
//! served where, and with which headers, is [`site`](crate::api::site)'s.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::{HeaderMap, header};
use base64::Engine;
use sha2::{Digest, Sha256};

/// The built widget: its pages (with the hashes of their inline scripts, for the policy) and
/// its files, compressed as asked.
#[derive(Debug, Default)]
pub struct Site {
    dir: Option<PathBuf>,
    /// `index.html` as built: the payment page and the dev page.
    pay: Page,
    /// `account/index.html` as built: the account window (`/account`).
    account: Page,
    /// Compressed bodies made so far, by (file, what the server wrote into it, encoding), with
    /// the version of the file they were made from.
    compressed: Mutex<HashMap<CompressedKey, (Version, Bytes)>>,
}

/// One of the checkout's pages as built, and the policy it is served with.
#[derive(Debug, Default)]
pub struct Page {
    html: String,
    /// `'sha256-…'` of each inline script of the page, for `script-src`.
    inline_hashes: String,
}

impl Page {
    /// The page at `path`; an empty one (served as `404`) if it was not built.
    fn read(path: &Path) -> Page {
        let Ok(html) = std::fs::read_to_string(path) else {
            return Page::default();
        };
        let inline_hashes = inline_scripts(&html)
            .map(|script| {
                let digest = Sha256::digest(script.as_bytes());
                format!(
                    " 'sha256-{}'",
                    base64::engine::general_purpose::STANDARD.encode(digest)
                )
            })
            .collect();
        Page {
            html,
            inline_hashes,
        }
    }

    /// The HTML as built (empty: not built).
    pub fn html(&self) -> &str {
        &self.html
    }

    /// The policy of the checkout's own pages: scripts, styles and connections from this origin
    /// only, WebAssembly allowed to compile, the page's own inline loader by its hash, framed
    /// by `frame_ancestors` only.
    pub fn policy(&self, frame_ancestors: &str) -> String {
        format!(
            "default-src 'none'; script-src 'self' 'wasm-unsafe-eval'{}; style-src 'self'; \
             img-src 'self' data:; connect-src 'self'; font-src 'self'; base-uri 'none'; \
             form-action 'self'; frame-ancestors {frame_ancestors}",
            self.inline_hashes
        )
    }
}

/// A file as it is on disk now (its length and modification time): a rebuilt file is compressed
/// again, not served stale.
type Version = (u64, Option<std::time::SystemTime>);

type CompressedKey = (PathBuf, String, Encoding);

/// A file of the built widget, read for one request.
pub struct File {
    pub path: PathBuf,
    pub raw: Vec<u8>,
    version: Version,
    /// What the server wrote into it (the loader's origin), if anything.
    written: String,
}

/// The loader as built, and what stands for the checkout's origin in it (a JavaScript string).
const LOADER: &str = "v1/checkout.js";
const ORIGIN_PLACEHOLDER: &str = "\"__CHECKOUT_ORIGIN__\"";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Encoding {
    Brotli,
    Gzip,
}

impl Encoding {
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Brotli => "br",
            Encoding::Gzip => "gzip",
        }
    }
}

impl Site {
    /// The widget built into `dir`; an empty site (API only) if there is none.
    pub fn open(dir: &Path) -> Site {
        let pay = Page::read(&dir.join("index.html"));
        if pay.html.is_empty() {
            return Site::default();
        }
        Site {
            dir: Some(dir.to_path_buf()),
            pay,
            account: Page::read(&dir.join("account").join("index.html")),
            compressed: Mutex::default(),
        }
    }

    /// The payment page's policy (and every other answer's, with `'none'`).
    pub fn policy(&self, frame_ancestors: &str) -> String {
        self.pay.policy(frame_ancestors)
    }

    /// Compresses every file in both encodings, in a thread of its own, so that no shopper
    /// waits for brotli's best quality (about a second for the WebAssembly).
    pub fn warm(self: &Arc<Site>) {
        let Some(dir) = self.dir.clone() else {
            return;
        };
        let site = self.clone();
        std::thread::spawn(move || {
            let mut dirs = vec![dir];
            while let Some(dir) = dirs.pop() {
                let Ok(entries) = std::fs::read_dir(&dir) else {
                    continue;
                };
                for path in entries.flatten().map(|e| e.path()) {
                    if path.is_dir() {
                        dirs.push(path);
                    } else if let Some(file) = read(path).filter(|f| compressible(&f.path)) {
                        for encoding in [Encoding::Brotli, Encoding::Gzip] {
                            site.compressed(&file, encoding);
                        }
                    }
                }
            }
        });
    }

    /// `index.html` as built (empty: no widget here, the API only).
    pub fn page(&self) -> &str {
        self.pay.html()
    }

    /// The account window's page as built.
    pub fn account(&self) -> &Page {
        &self.account
    }

    /// A file of the built widget, for `GET /{path}`: `None` if there is no such file.
    pub fn file(&self, path: &str) -> Option<File> {
        let dir = self.dir.as_ref()?;
        // Only plain names below the directory: no `..`, no absolute paths, no hidden files.
        let clean = path.trim_start_matches('/');
        // The pages themselves only as `/pay/{id}` and `/account`, which give them their policy.
        let plain = !clean.is_empty()
            && !clean.ends_with("index.html")
            && clean.split('/').all(|part| {
                !part.is_empty()
                    && !part.starts_with('.')
                    && part
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            });
        // The loader only with its origin written in (`loader`).
        if !plain || clean == LOADER {
            return None;
        }
        read(dir.join(clean))
    }

    /// The loader with the checkout's `origin` written in (a JavaScript string literal).
    pub fn loader(&self, origin: &str) -> Option<File> {
        let mut file = read(self.dir.as_ref()?.join(LOADER))?;
        let literal = serde_json::to_string(origin).ok()?.replace('<', "\\u003c");
        let text = String::from_utf8(std::mem::take(&mut file.raw)).ok()?;
        file.raw = text.replacen(ORIGIN_PLACEHOLDER, &literal, 1).into_bytes();
        file.written = origin.to_owned();
        Some(file)
    }

    /// The file compressed: made once per version of it, then kept.
    pub fn compressed(&self, file: &File, encoding: Encoding) -> Bytes {
        let key = (file.path.clone(), file.written.clone(), encoding);
        if let Some((version, done)) = self.lock().get(&key)
            && *version == file.version
        {
            return done.clone();
        }
        let body = Bytes::from(compress(&file.raw, encoding));
        self.lock().insert(key, (file.version, body.clone()));
        body
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<CompressedKey, (Version, Bytes)>> {
        self.compressed.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn read(path: PathBuf) -> Option<File> {
    let meta = std::fs::metadata(&path).ok()?;
    if !meta.is_file() {
        return None;
    }
    let raw = std::fs::read(&path).ok()?;
    Some(File {
        version: (meta.len(), meta.modified().ok()),
        path,
        raw,
        written: String::new(),
    })
}

fn compress(raw: &[u8], encoding: Encoding) -> Vec<u8> {
    match encoding {
        Encoding::Brotli => {
            let mut out = Vec::new();
            {
                // Quality 11 (the best): done once per file, for every shopper after.
                let mut writer = brotli::CompressorWriter::new(&mut out, 64 * 1024, 11, 22);
                let _ = writer.write_all(raw);
            }
            out
        }
        Encoding::Gzip => {
            let mut writer = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
            let _ = writer.write_all(raw);
            writer.finish().unwrap_or_default()
        }
    }
}

/// The contents of `<script>` elements that have no `src`, exactly as written.
pub fn inline_scripts(html: &str) -> impl Iterator<Item = &str> {
    html.split("<script").skip(1).filter_map(|rest| {
        let (attributes, rest) = rest.split_once('>')?;
        let (content, _) = rest.split_once("</script>")?;
        (!attributes.contains("src=")).then_some(content)
    })
}

/// Text and WebAssembly shrink; images and the rest are sent as they are.
pub fn compressible(file: &Path) -> bool {
    matches!(
        file.extension().and_then(|e| e.to_str()),
        Some("wasm" | "js" | "css" | "html" | "json" | "svg")
    )
}

/// The best encoding the browser accepts: brotli, else gzip, else none.
pub fn accepted(headers: &HeaderMap) -> Option<Encoding> {
    let accept = headers
        .get(header::ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let takes = |name: &str| {
        accept.split(',').any(|part| {
            let mut fields = part.split(';');
            let token = fields.next().unwrap_or("").trim();
            let refused = fields.any(|f| f.trim().replace(' ', "") == "q=0");
            token.eq_ignore_ascii_case(name) && !refused
        })
    };
    if takes("br") {
        Some(Encoding::Brotli)
    } else if takes("gzip") {
        Some(Encoding::Gzip)
    } else {
        None
    }
}

/// `checkout-frontend-1b2c3d4e5f607182_bg.wasm`: a name with a hash Trunk put in it.
pub fn is_content_hashed(name: &str) -> bool {
    name.split(['-', '_', '.'])
        .any(|part| (12..=16).contains(&part.len()) && part.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_inline_scripts_are_hashed() {
        let html = r#"<head><script type="module" nonce="x">import init from '/a.js';init();</script>
            <script src="/b.js"></script><script>
</script></head>"#;
        let found: Vec<_> = inline_scripts(html).collect();
        assert_eq!(found, ["import init from '/a.js';init();", "\n"]);
    }

    #[test]
    fn brotli_then_gzip_as_accepted_and_hashed_names_are_immutable() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ACCEPT_ENCODING,
            "gzip, deflate, br, zstd".parse().unwrap(),
        );
        assert_eq!(accepted(&headers), Some(Encoding::Brotli));
        headers.insert(header::ACCEPT_ENCODING, "gzip, br;q=0".parse().unwrap());
        assert_eq!(accepted(&headers), Some(Encoding::Gzip));
        headers.remove(header::ACCEPT_ENCODING);
        assert_eq!(accepted(&headers), None);
        assert!(is_content_hashed(
            "checkout-frontend-9f8e7d6c5b4a3f2e_bg.wasm"
        ));
        assert!(is_content_hashed("style-0123456789abcdef.css"));
        assert!(is_content_hashed("checkout-frontend-5729f2f24dcfd36.js"));
        assert!(!is_content_hashed("checkout.js"));
        let raw = b"hello hello hello hello hello".repeat(100);
        for encoding in [Encoding::Brotli, Encoding::Gzip] {
            assert!(compress(&raw, encoding).len() < raw.len() / 10);
        }
    }
}
