"""Column names the pipeline's stages agree on: ours between stages, and those of Ray Data LLM's engine output."""

# ours: added by the read (which source row: its data file and position), carried through every stage
SOURCE_FILE = "__icebatch_source_file"
SOURCE_POS = "__icebatch_source_pos"
SOURCE_HASH = (
    "__icebatch_source_hash"  # its content: the id and the columns the task reads (icebatch_job.plan.identity)
)
# ours: added by the prompt (or endpoint) stage, read by the driver's parse (icebatch_job.stages.parse)
SOURCE_ID = "__icebatch_source_id"
TRUNCATED = "__icebatch_truncated"
EMPTY_INPUT = "__icebatch_empty_input"  # every input column blank: the answer is not a label
MEMBER = "__icebatch_member"  # a shared job's (``icebatch_job.shared``): which of its runs the row is for
# what ray.data.llm's vLLM stage reads ...
TOKENIZED_PROMPT = "tokenized_prompt"
SAMPLING_PARAMS = "sampling_params"
# ... and writes (the endpoint stage writes the same)
GENERATED_TEXT = "generated_text"
NUM_INPUT_TOKENS = "num_input_tokens"
NUM_GENERATED_TOKENS = "num_generated_tokens"
TIME_TAKEN_LLM = "time_taken_llm"
INFERENCE_ERROR = "__inference_error__"

# what the driver's parse reads of an engine output row; the processor's postprocess sends on no more
PARSED_FIELDS = (
    SOURCE_ID,
    SOURCE_FILE,
    SOURCE_POS,
    SOURCE_HASH,
    GENERATED_TEXT,
    INFERENCE_ERROR,
    TRUNCATED,
    EMPTY_INPUT,
    NUM_INPUT_TOKENS,
    NUM_GENERATED_TOKENS,
    TIME_TAKEN_LLM,
    MEMBER,
)

# the CPU share of the light stages: on 2 cores, whole CPUs for them starve the engine
SMALL_CPU = 0.1
