import Testing

@testable import Secure

#if canImport(Glibc)
    import Glibc
#endif

@Suite struct IdentityTests {
    func tempPath() -> String {
        "/tmp/tusa-identity-\(getpid())-\(UInt32.random(in: 0...UInt32.max)).key"
    }

    @Test func writeThenReadGivesTheSameKeyWithMode0600() throws {
        let path = tempPath()
        defer { unlink(path) }
        let id = Identity.generate()
        try id.write(to: path)
        var st = stat()
        #expect(stat(path, &st) == 0)
        #expect(st.st_mode & 0o777 == 0o600)
        let back = try Identity.read(from: path)
        #expect(back.publicKey == id.publicKey)
        #expect(throws: IdentityFileError.exists(path)) { try Identity.generate().write(to: path) }
        try Identity.generate().write(to: path, overwrite: true)
        #expect(try Identity.read(from: path).publicKey != id.publicKey)
    }

    /// A folder where the key file should be is named as one, with --force too (it
    /// said "already exists (… or pass --force)", and "readable by others").
    @Test func aFolderIsNotAKeyFile() throws {
        let path = tempPath()
        #expect(mkdir(path, 0o755) == 0)
        defer { rmdir(path) }
        for overwrite in [false, true] {
            #expect(throws: IdentityFileError.cannotCreate(path, errno: EISDIR)) {
                try Identity.generate().write(to: path, overwrite: overwrite)
            }
        }
        #expect(throws: IdentityFileError.cannotRead(path, errno: EISDIR)) { try Identity.read(from: path) }
        #expect("\(IdentityFileError.cannotRead(path, errno: EISDIR))" == "cannot read \(path): Is a directory")
    }

    @Test func refusesAFileOthersCanRead() throws {
        let path = tempPath()
        defer { unlink(path) }
        try Identity.generate().write(to: path)
        chmod(path, 0o644)
        #expect(throws: IdentityFileError.self) { try Identity.read(from: path) }
        do { _ = try Identity.read(from: path) } catch let e as IdentityFileError {
            #expect("\(e)".contains("chmod 600"))
        }
    }

    @Test func malformedFilesNameTheLine() throws {
        let id = Identity.generate()
        let good = id.fileText()
        #expect(try Identity.parse(good, path: "k").publicKey == id.publicKey)
        let cases: [(String, Int)] = [
            ("private-key: abc\n", 1),
            ("# c\nnonsense\n", 2),
            ("# c\n\ncolour: blue\n", 3),
        ]
        for (text, line) in cases {
            #expect(throws: IdentityFileError.self) { try Identity.parse(text, path: "k") }
            do { _ = try Identity.parse(text, path: "k") } catch let IdentityFileError.malformed(_, l, _) {
                #expect(l == line)
            }
        }
        #expect(throws: IdentityFileError.self) { try Identity.parse("# empty\n", path: "k") }
        let other = Identity.generate().publicKey.base64
        let mismatched = good.replacingOccurrences(of: "public-key: \(id.publicKey.base64)", with: "public-key: \(other)")
        #expect(throws: IdentityFileError.self) { try Identity.parse(mismatched, path: "k") }
        #expect(throws: IdentityFileError.self) { try Identity.read(from: "/nonexistent/dir/key") }
    }

    @Test func fingerprintsAreThirtyDigitsAndSafetyNumbersAgree() {
        let a = Identity.generate().publicKey
        let b = Identity.generate().publicKey
        let fa = Fingerprint.digits(of: a)
        #expect(fa.count == 35)
        #expect(
            fa.split(separator: " ").count == 6
                && fa.split(separator: " ").allSatisfy { $0.count == 5 && $0.allSatisfy(\.isNumber) })
        #expect(fa == Fingerprint.digits(of: a))
        #expect(fa != Fingerprint.digits(of: b))
        #expect(Fingerprint.safetyNumber(a, b) == Fingerprint.safetyNumber(b, a))
        #expect(Fingerprint.safetyNumber(a, b).contains(fa))
    }
}

extension String {
    func replacingOccurrences(of a: String, with b: String) -> String {
        split(separator: a, omittingEmptySubsequences: false).joined(separator: b)
    }
}
