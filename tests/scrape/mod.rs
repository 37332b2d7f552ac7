//! Scraping a metrics endpoint over a real socket (raw HTTP/1.1) and
//! reading it with a real parser of the text format (`prometheus-parse`).

#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use prometheus_parse::{Scrape, Value as Sampled};

pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// One raw HTTP/1.1 exchange: the status line, the headers, the body.
pub fn exchange(mut stream: impl Read + Write, request: &str) -> (String, String, String) {
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no head: {response:?}"));
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (status.to_string(), headers.to_string(), body.to_string())
}

pub const GET: &str = "GET /metrics HTTP/1.1\r\nHost: metrics\r\nAccept: */*\r\n\r\n";

/// `GET /metrics`, checked and parsed.
pub fn scrape(stream: impl Read + Write) -> Metrics {
    let (status, headers, body) = exchange(stream, GET);
    assert_eq!(status, "HTTP/1.1 200 OK", "{headers}\n{body}");
    assert!(headers.contains(&format!("Content-Type: {CONTENT_TYPE}")), "{headers}");
    assert!(body.ends_with("# EOF\n"), "{body}");
    let parsed = Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).expect("the text format parses");
    Metrics { parsed, text: body }
}

pub fn scrape_unix(path: &Path) -> Metrics {
    scrape(UnixStream::connect(path).unwrap_or_else(|e| panic!("connect {}: {e}", path.display())))
}

pub struct Metrics {
    pub parsed: Scrape,
    pub text: String,
}

impl Metrics {
    /// The value of the sample `name` whose labels include `labels`.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.parsed
            .samples
            .iter()
            .filter(|s| s.metric == name)
            .find(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .map(|s| match &s.value {
                Sampled::Counter(v) | Sampled::Gauge(v) | Sampled::Untyped(v) => *v,
                Sampled::Histogram(buckets) => buckets.iter().map(|b| b.count).fold(0.0, f64::max),
                Sampled::Summary(_) => f64::NAN,
            })
    }

    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels).unwrap_or_else(|| panic!("no {name}{labels:?} in:\n{}", self.text))
    }

    /// Every label value of every sample.
    pub fn label_values(&self) -> Vec<String> {
        self.parsed.samples.iter().flat_map(|s| s.labels.values().cloned().collect::<Vec<_>>()).collect()
    }
}
