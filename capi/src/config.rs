//! Which devices exist: rdma-core finds them in sysfs; softrdma reads them from a
//! configuration, `SOFTRDMA_DEVICES` or the file `SOFTRDMA_CONFIG` names (by default
//! `/etc/softrdma/devices`). One device per line (or per `;` in the variable):
//!
//! ```text
//! # name       transport  address     [UDP port, RoCEv2 only]
//! softrdma0    rocev2     127.0.0.1   4791
//! softiwarp0   iwarp      127.0.0.1
//! ```

use softrdma::verbs::Transport;
use std::net::IpAddr;

/// One configured device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceConfig {
    /// Its name (`ibv_get_device_name`).
    pub name: String,
    /// RoCEv2 or iWARP.
    pub transport: Transport,
    /// The address it sends from and receives on.
    pub addr: IpAddr,
    /// RoCEv2: the UDP port (4791 unless testing).
    pub port: u16,
}

/// Longest device name rdma-core's `struct ibv_device` holds, its NUL included.
pub const NAME_MAX_BYTES: usize = 64;

/// A configuration line that is not a device, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The line, as written.
    pub line: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Parses a configuration: the devices, or the first line that is not one.
pub fn parse(text: &str) -> Result<Vec<DeviceConfig>, ConfigError> {
    let mut devices: Vec<DeviceConfig> = Vec::new();
    for raw in text.split(['\n', ';']) {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let err = |reason: &str| ConfigError { line: raw.trim().to_string(), reason: reason.to_string() };
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [name, transport, addr, rest @ ..] = fields.as_slice() else {
            return Err(err("expected: name transport address [port]"));
        };
        if name.len() >= NAME_MAX_BYTES || !name.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(err("a name is 1 to 63 printable characters"));
        }
        if devices.iter().any(|d| d.name == *name) {
            return Err(err("a second device of this name"));
        }
        let transport: Transport = transport.parse().map_err(|e: String| err(&e))?;
        let addr: IpAddr = addr.parse().map_err(|_| err("not an IP address"))?;
        let port = match rest {
            [] => softrdma::transport::udp::ROCE_PORT,
            [p] => p.parse().map_err(|_| err("not a port number"))?,
            _ => return Err(err("too many fields")),
        };
        devices.push(DeviceConfig { name: name.to_string(), transport, addr, port });
    }
    Ok(devices)
}

/// The configuration in force: `SOFTRDMA_DEVICES`, else the file `SOFTRDMA_CONFIG` names,
/// else `/etc/softrdma/devices`; none of them: no devices.
pub fn load() -> Result<Vec<DeviceConfig>, ConfigError> {
    if let Ok(text) = std::env::var("SOFTRDMA_DEVICES") {
        return parse(&text);
    }
    let path = std::env::var("SOFTRDMA_CONFIG").unwrap_or_else(|_| "/etc/softrdma/devices".to_string());
    match std::fs::read_to_string(&path) {
        Ok(text) => parse(&text),
        Err(_) => Ok(Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_are_read_from_lines_or_semicolons() {
        let got = parse("softrdma0 rocev2 127.0.0.1 4791 # loopback\n\n; siw0 iwarp ::1").unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].name, "softrdma0");
        assert_eq!(got[0].port, 4791);
        assert_eq!(got[1].transport, Transport::Iwarp);
        assert_eq!(got[1].addr, "::1".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn a_bad_line_is_named_with_its_reason() {
        for (text, reason) in [
            ("dev rocev2", "expected"),
            ("dev ib 127.0.0.1", "unknown transport"),
            ("dev rocev2 localhost", "not an IP"),
            ("dev rocev2 127.0.0.1 99999", "not a port"),
            ("a rocev2 127.0.0.1; a iwarp 127.0.0.1", "second device"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.reason.contains(reason), "{text:?}: {e:?}");
        }
        let long = format!("{} rocev2 127.0.0.1", "x".repeat(NAME_MAX_BYTES));
        assert!(parse(&long).is_err(), "a name that does not fit ibv_device.name");
    }
}
