# petrel tokenize: ids and decoded text match the reference library (values
# below were produced by the npm `tokenizers` package for the committed
# fixture tokenizers), files are read byte for byte, and bad input fails with
# clear messages.
source tests/cli/lib.bash
F=tests/fixtures/tokenizers

# expect_out NAME EXPECTED CMD... : exit 0 and stdout exactly EXPECTED (plus the newline for ids).
expect_out() {
  local name=$1 want=$2; shift 2
  local got; got=$("$@" 2>"$TMP/err"); local rc=$?
  if [ $rc -eq 0 ] && [ "$got" = "$want" ]; then pass "$name"; else fail "$name" "exit $rc, got '$got', want '$want'; stderr: $(head -c 300 "$TMP/err")"; fi
}

expect_out tokenize_llama3 "72 914 111 272 288 108 100" $PETREL tokenize --tokenizer $F/llama3.json --text "Hello world"
expect_out tokenize_llama3_special "1606 72 914 111 272 288 108 100" $PETREL tokenize --tokenizer $F/llama3.json --text "Hello world" --special
expect_out tokenize_added_tokens "104 105 1611 351 921 32 60 386 424 116 95 111 102 95 561 62 1059 10" \
  $PETREL tokenize --tokenizer $F/llama3.json --text $'hi<|eot_id|>there <start_of_turn>user\n'
expect_out tokenize_gemma_byte_fallback "2 982 199 179 286 261 1492 260 228 171 171 228 171 172 228 171 173" \
  $PETREL tokenize --tokenizer $F/gemma.json --text "naïve 😀 ১২৩" --special

# --text-file: CRLF and the trailing newline are kept
printf 'line one\r\nline two\n' >"$TMP/in.txt"
expect_out tokenize_text_file "108 271 101 342 101 13 10 108 271 101 262 119 111 10" $PETREL tokenize --tokenizer $F/llama3.json --text-file "$TMP/in.txt"
expect_out tokenize_text_file_gemma "271 922 261 260 920 261 17 294 271 922 261 917 279 268 294" $PETREL tokenize --tokenizer $F/gemma.json --text-file "$TMP/in.txt"
: >"$TMP/empty.txt"
expect_out tokenize_empty "" $PETREL tokenize --tokenizer $F/llama3.json --text-file "$TMP/empty.txt"

# -m DIR: tokenizer.json from a model directory
mkdir -p "$TMP/model" && cp $F/gemma.json "$TMP/model/tokenizer.json"
expect_out tokenize_model_dir "2 895 949 271 268 923 931 271 270" $PETREL tokenize -m "$TMP/model" --text "Hello world" --special

# decode, with and without special tokens; output is byte-exact (no newline added)
$PETREL tokenize --tokenizer $F/gemma.json --decode --ids "2 1141 64 128 261 268 265 99 1145 128 66 953 918 261 260 1592 1177 918 294" >"$TMP/dec" 2>"$TMP/err"
if [ $? -eq 0 ] && [ "$(od -An -c "$TMP/dec" | tr -s ' ')" = "$(printf '<bos>hi<|eot_id|>there <start_of_turn>user\n' | od -An -c | tr -s ' ')" ]; then pass tokenize_decode; else fail tokenize_decode "got '$(cat "$TMP/dec")'"; fi
expect_out tokenize_decode_skip "hi<|eot_id|>there user" $PETREL tokenize --tokenizer $F/gemma.json --decode --skip-special --ids "2,1141,64,128,261,268,265,99,1145,128,66,953,918,261,260,1592,1177,918,294"
expect_out tokenize_decode_bytes "naïve 😀 ১২৩" $PETREL tokenize --tokenizer $F/llama3.json --decode --ids "110 376 175 118 101 32 508 128 32 362 167 362 168 362 169"

# help and errors
expect_exit tokenize_help 0 $PETREL tokenize --help
expect_stdout tokenize_help_text 'text-file'
expect_exit tokenize_no_source 2 $PETREL tokenize --text hi
expect_stderr tokenize_no_source_msg 'exactly one of -m DIR or --tokenizer FILE'
expect_exit tokenize_unknown_flag 2 $PETREL tokenize --tokenizer $F/llama3.json --text hi --bogus
expect_stderr tokenize_unknown_flag_msg "unknown argument '--bogus'"
expect_exit tokenize_bad_ids 2 $PETREL tokenize --tokenizer $F/llama3.json --decode --ids "1 x 3"
expect_exit tokenize_id_range 1 $PETREL tokenize --tokenizer $F/llama3.json --decode --ids "1 999999"
expect_stderr tokenize_id_range_msg 'id 999999 at position 1 is outside the vocabulary'
printf 'ok \xff bad' >"$TMP/bad.txt"
expect_exit tokenize_invalid_utf8 1 $PETREL tokenize --tokenizer $F/llama3.json --text-file "$TMP/bad.txt"
expect_stderr tokenize_invalid_utf8_msg 'not valid UTF-8 \(byte offset 3\)'
expect_exit tokenize_missing_file 1 $PETREL tokenize --tokenizer "$TMP/nope.json" --text hi
expect_stderr tokenize_missing_file_msg 'nope.json'
printf '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a zz"]}}' >"$TMP/bad.json"
expect_exit tokenize_bad_merges 1 $PETREL tokenize --tokenizer "$TMP/bad.json" --text a
expect_stderr tokenize_bad_merges_msg 'merges\[0\]: token "zz" is not in the vocabulary'
printf '{"added_tokens": []}' >"$TMP/nomodel.json"
expect_exit tokenize_missing_model 1 $PETREL tokenize --tokenizer "$TMP/nomodel.json" --text a
expect_stderr tokenize_missing_model_msg 'missing "model"'
expect_exit tokenize_no_tokenizer_in_dir 1 $PETREL tokenize -m "$TMP" --text a
expect_stderr tokenize_no_tokenizer_in_dir_msg 'no tokenizer.json'
