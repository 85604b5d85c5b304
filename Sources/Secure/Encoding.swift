import CSodium

/// Base64 (standard alphabet, padded) through libsodium.
enum Base64 {
    static func encode(_ bytes: [UInt8]) -> String {
        Sodium.ensureInitialized()
        let variant = Int32(sodium_base64_VARIANT_ORIGINAL)
        let length = sodium_base64_encoded_len(bytes.count, variant)
        var out = [CChar](repeating: 0, count: length)
        bytes.withUnsafeBufferPointer { b in
            _ = sodium_bin2base64(&out, length, b.baseAddress, b.count, variant)
        }
        return String(decoding: out.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    static func decode(_ text: String) -> [UInt8]? {
        Sodium.ensureInitialized()
        let chars = Array(text.utf8)
        var out = [UInt8](repeating: 0, count: chars.count * 3 / 4 + 3)
        var written = 0
        var end: UnsafePointer<CChar>? = nil
        let rc = chars.withUnsafeBufferPointer { c in
            c.withMemoryRebound(to: CChar.self) { cc in
                sodium_base642bin(
                    &out, out.count, cc.baseAddress, cc.count, nil, &written, &end,
                    Int32(sodium_base64_VARIANT_ORIGINAL))
            }
        }
        // Trailing garbage leaves `end` short of the input's end.
        guard rc == 0, let end else { return nil }
        let consumed = chars.withUnsafeBufferPointer { c in
            c.withMemoryRebound(to: CChar.self) { cc in cc.baseAddress.map { end - $0 } ?? 0 }
        }
        guard consumed == chars.count else { return nil }
        return Array(out.prefix(written))
    }
}

/// Lower-case hexadecimal.
enum Hex {
    private static let digits = Array("0123456789abcdef".utf8)

    static func encode(_ bytes: some Sequence<UInt8>) -> String {
        var out: [UInt8] = []
        for b in bytes {
            out.append(digits[Int(b >> 4)])
            out.append(digits[Int(b & 0x0F)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    static func decode(_ text: String) -> [UInt8]? {
        let chars = Array(text.utf8)
        guard chars.count % 2 == 0 else { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(chars.count / 2)
        var i = 0
        while i < chars.count {
            guard let hi = nibble(chars[i]), let lo = nibble(chars[i + 1]) else { return nil }
            out.append(hi << 4 | lo)
            i += 2
        }
        return out
    }

    private static func nibble(_ c: UInt8) -> UInt8? {
        switch c {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): c - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}
