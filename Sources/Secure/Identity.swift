import CSodium

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Why an identity key file could not be written or read.
public enum IdentityFileError: Error, Equatable, Sendable, CustomStringConvertible {
    case exists(String)
    case cannotCreate(String, errno: Int32)
    case cannotRead(String, errno: Int32)
    case tooOpen(String, mode: UInt32)
    case malformed(String, line: Int, reason: String)

    public var description: String {
        switch self {
        case .exists(let p): "\(p) already exists (remove it first, or pass --force)"
        case .cannotCreate(let p, let e): "cannot create \(p): \(String(cString: strerror(e)))"
        case .cannotRead(let p, let e): "cannot read \(p): \(String(cString: strerror(e)))"
        case .tooOpen(let p, let mode):
            "\(p) is readable by others (mode \(String(mode & 0o777, radix: 8))); run: chmod 600 \(p)"
        case .malformed(let p, let line, let reason): "\(p):\(line): \(reason)"
        }
    }
}

/// A long-term identity: the X25519 static key a peer is known by.
///
/// The key file is text, mode 0600, created exclusively:
///
///     # Tusa identity key. Keep it secret: whoever holds it can be you.
///     private-key: <base64, 32 bytes>
///     public-key: <base64, 32 bytes>
///
/// Reading refuses a file that group or others may read (as ssh does), a
/// private key whose public half does not match the `public-key` line, and
/// anything it does not understand, naming the line.
public struct Identity: Sendable {
    public let privateKey: PrivateKey
    public var publicKey: PublicKey { privateKey.publicKey }

    public init(privateKey: PrivateKey) { self.privateKey = privateKey }

    public static func generate() -> Identity { Identity(privateKey: .generate()) }

    /// The file's text.
    func fileText() -> String {
        let priv = privateKey.secret.withUnsafeBytes { Base64.encode(Array($0)) }
        return """
            # Tusa identity key. Keep it secret: whoever holds it can be you.
            private-key: \(priv)
            public-key: \(publicKey.base64)

            """
    }

    /// Writes the key to `path` with mode 0600; refuses to replace a file unless `overwrite`.
    public func write(to path: String, overwrite: Bool = false) throws {
        if overwrite { unlink(path) }
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            let e = errno
            var st = stat()
            // A folder is not replaced, --force or not: say what it is.
            if e == EEXIST, stat(path, &st) == 0, st.st_mode & S_IFMT == S_IFDIR {
                throw IdentityFileError.cannotCreate(path, errno: EISDIR)
            }
            throw e == EEXIST ? IdentityFileError.exists(path) : IdentityFileError.cannotCreate(path, errno: e)
        }
        defer { close(fd) }
        var text = Array(fileText().utf8)
        defer { sodium_memzero(&text, text.count) }
        var done = 0
        while done < text.count {
            let n = text.withUnsafeBytes { raw in Glibc.write(fd, raw.baseAddress.map { $0 + done }, raw.count - done) }
            if n < 0 {
                if errno == EINTR { continue }
                let e = errno
                unlink(path)
                throw IdentityFileError.cannotCreate(path, errno: e)
            }
            done += n
        }
    }

    /// Reads a key file written by `write(to:)` (or `tusa keygen`).
    public static func read(from path: String) throws -> Identity {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw IdentityFileError.cannotRead(path, errno: errno) }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0 else { throw IdentityFileError.cannotRead(path, errno: errno) }
        if st.st_mode & S_IFMT == S_IFDIR { throw IdentityFileError.cannotRead(path, errno: EISDIR) }
        if st.st_mode & 0o077 != 0 { throw IdentityFileError.tooOpen(path, mode: UInt32(st.st_mode)) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        defer { sodium_memzero(&bytes, bytes.count) }
        while true {
            let n = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR { continue }
                throw IdentityFileError.cannotRead(path, errno: errno)
            }
            if n == 0 { break }
            bytes.append(contentsOf: chunk[..<n])
            guard bytes.count <= 16384 else {
                throw IdentityFileError.malformed(path, line: 0, reason: "file too large for a key file")
            }
        }
        return try parse(String(decoding: bytes, as: UTF8.self), path: path)
    }

    static func parse(_ text: String, path: String) throws -> Identity {
        var priv: PrivateKey?
        var pub: PublicKey?
        for (i, raw) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let line = raw.trimmingCharacters(in: " \t\r")
            if line.isEmpty || line.hasPrefix("#") { continue }
            guard let colon = line.firstIndex(of: ":") else {
                throw IdentityFileError.malformed(path, line: i + 1, reason: "expected 'name: value'")
            }
            let name = line[..<colon].trimmingCharacters(in: " \t")
            let value = line[line.index(after: colon)...].trimmingCharacters(in: " \t")
            switch name {
            case "private-key":
                guard var bytes = Base64.decode(value), bytes.count == 32 else {
                    throw IdentityFileError.malformed(path, line: i + 1, reason: "private-key is not 32 bytes of base64")
                }
                defer { sodium_memzero(&bytes, bytes.count) }
                priv = try PrivateKey(bytes: bytes)
            case "public-key":
                guard let k = PublicKey(base64: value) else {
                    throw IdentityFileError.malformed(path, line: i + 1, reason: "public-key is not 32 bytes of base64")
                }
                pub = k
            default:
                throw IdentityFileError.malformed(path, line: i + 1, reason: "unknown field '\(name)'")
            }
        }
        guard let priv else { throw IdentityFileError.malformed(path, line: 0, reason: "no private-key line") }
        if let pub, pub != priv.publicKey {
            throw IdentityFileError.malformed(path, line: 0, reason: "public-key does not belong to private-key")
        }
        return Identity(privateKey: priv)
    }
}

/// Short, human-comparable fingerprints of public keys.
///
/// A key's fingerprint is 30 digits in six groups of five, from the first 30
/// bytes of BLAKE2b-512("tusa fingerprint v1" ‖ key) (each group: five bytes
/// as a big-endian number mod 100000), like Signal's safety numbers. The
/// safety number of a call is both keys' fingerprints, the lower key's first,
/// so both ends see the same 60 digits and can read them to each other.
public enum Fingerprint {
    public static func digits(of key: PublicKey) -> String {
        let h = MAC.blake2b([ArraySlice("tusa fingerprint v1".utf8), key.bytes[...]], key: [], outputLength: 64)
        var groups: [String] = []
        for g in 0..<6 {
            var v: UInt64 = 0
            for i in 0..<5 { v = v << 8 | UInt64(h[g * 5 + i]) }
            let s = String(v % 100_000)
            groups.append(String(repeating: "0", count: 5 - s.count) + s)
        }
        return groups.joined(separator: " ")
    }

    /// The safety number both ends of a call between `a` and `b` compute alike.
    public static func safetyNumber(_ a: PublicKey, _ b: PublicKey) -> String {
        let (first, second) = a.bytes.lexicographicallyPrecedes(b.bytes) ? (a, b) : (b, a)
        return digits(of: first) + " " + digits(of: second)
    }
}

extension StringProtocol {
    func trimmingCharacters(in set: String) -> String {
        let chars = Set(set)
        var s = Substring(self)
        while let f = s.first, chars.contains(f) { s.removeFirst() }
        while let l = s.last, chars.contains(l) { s.removeLast() }
        return String(s)
    }
}
