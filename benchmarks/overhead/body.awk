# A chat completions body of about `size` bytes (awk -v size=N -f body.awk):
# a system prompt and a user message of English text. run.sh and
# instructions.sh send it.
BEGIN {
	s = "The quick brown fox jumps over the lazy dog while the model server keeps its cache warm. "
	text = ""
	while (length(text) < size - 220) text = text s
	text = substr(text, 1, size - 220)
	printf "{\"model\":\"meta-llama/Llama-3.1-8B-Instruct\",\"messages\":[{\"role\":\"system\",\"content\":\"You are a helpful assistant.\"},{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":64,\"temperature\":0.7,\"user\":\"bench\"}", text
}
